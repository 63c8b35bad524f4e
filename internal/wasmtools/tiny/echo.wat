;; tiny-echo: copies standard input to standard output until end of input.
;; Memory layout: an iovec {buf, len} at 0, a result count at 8, and the
;; buffer from 16 to the end of the single 64 KiB page.
(module
  (import "wasi_snapshot_preview1" "fd_read"
    (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (local $n i32)
    (block $done
      (loop $read
        (i32.store (i32.const 0) (i32.const 16))
        (i32.store (i32.const 4) (i32.const 65520))
        (br_if $done
          (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
        (local.set $n (i32.load (i32.const 8)))
        (br_if $done (i32.eqz (local.get $n)))
        (i32.store (i32.const 4) (local.get $n))
        (loop $write
          (br_if $done
            (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
          ;; Advance past what was written; write the rest.
          (i32.store (i32.const 0)
            (i32.add (i32.load (i32.const 0)) (i32.load (i32.const 8))))
          (i32.store (i32.const 4)
            (i32.sub (i32.load (i32.const 4)) (i32.load (i32.const 8))))
          (br_if $write (i32.load (i32.const 4))))
        (br $read)))))

;; trap: executes unreachable, a WebAssembly trap.
(module
  (func (export "_start")
    unreachable))

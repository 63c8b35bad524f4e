;; loop: spins forever without calling the host; only the runtime's
;; timeout or cancellation stops it.
(module
  (func (export "_start")
    (loop $forever
      (br $forever))))

;; `keel-warm-up`: keel's own tool, which `Host::warm_up` calls once so that a
;; first call finds the host's whole call path run before (README,
;; Performance: levers kept). Written by hand in the component text format,
;; assembled by the build script, and loaded like any plugin.
;;
;; It imports nothing, so whatever it is granted it can reach nothing. It
;; exports the whole `keel:tool/guest@0.4.0` contract with fixed answers:
;; enabled, its plan fixed at load as concurrency-safe and read-only, its
;; input never checked, not destructive; `call` answers one text block,
;; "warm", whatever its input.
(component
  (core module $m
    (memory (export "memory") 1)
    (global $bump (mut i32) (i32.const 4096))

    ;; A bump allocator, for the host to pass inputs in; a sandbox lives for
    ;; one call, so nothing is ever freed.
    (func (export "realloc") (param i32 i32) (param $align i32) (param $size i32) (result i32)
      (local $at i32)
      (local.set $at
        (i32.and
          (i32.add (global.get $bump) (i32.sub (local.get $align) (i32.const 1)))
          (i32.sub (i32.const 0) (local.get $align))))
      (global.set $bump (i32.add (local.get $at) (local.get $size)))
      (block $fits
        (br_if $fits (i32.le_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536))))
        (br_if $fits
          (i32.ne
            (memory.grow
              (i32.add
                (i32.shr_u (i32.sub (global.get $bump) (i32.mul (memory.size) (i32.const 65536))) (i32.const 16))
                (i32.const 1)))
            (i32.const -1)))
        unreachable)
      (local.get $at))

    (data (i32.const 16) "keel-warm-up")
    (data (i32.const 32) "keel's own tool, called once at warm-up.")
    (data (i32.const 80) "{\22type\22:\22object\22}")
    (data (i32.const 112) "warm")

    ;; tool-metadata at 256, 76 bytes: name, aliases (none), description,
    ;; prompt (empty), input-schema, output-schema and search-hint (none),
    ;; three false flags and `cancel`, user-facing-name (the name).
    (func (export "metadata") (result i32)
      (i32.store (i32.const 256) (i32.const 16)) (i32.store (i32.const 260) (i32.const 12))
      (i32.store (i32.const 264) (i32.const 0)) (i32.store (i32.const 268) (i32.const 0))
      (i32.store (i32.const 272) (i32.const 32)) (i32.store (i32.const 276) (i32.const 40))
      (i32.store (i32.const 280) (i32.const 0)) (i32.store (i32.const 284) (i32.const 0))
      (i32.store (i32.const 288) (i32.const 80)) (i32.store (i32.const 292) (i32.const 17))
      (i32.store8 (i32.const 296) (i32.const 0))
      (i32.store8 (i32.const 308) (i32.const 0))
      (i32.store (i32.const 320) (i32.const 0))
      (i32.store (i32.const 324) (i32.const 16)) (i32.store (i32.const 328) (i32.const 12))
      (i32.const 256))
    (func (export "true") (result i32) (i32.const 1))
    (func (export "false") (result i32) (i32.const 0))
    (func (export "false-of-inputs") (param i32 i32 i32 i32) (result i32) (i32.const 0))
    (func (export "true-of-inputs") (param i32 i32 i32 i32) (result i32) (i32.const 1))
    ;; option<u64> at 512: none, so the default applies.
    (func (export "max-result-size") (result i32)
      (i32.store8 (i32.const 512) (i32.const 0))
      (i32.const 512))
    ;; call-plan at 528: concurrency-safe and read-only.
    (func (export "plan") (param i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 528) (i32.const 1))
      (i32.store8 (i32.const 529) (i32.const 1))
      (i32.const 528))
    ;; option<call-plan> at 532: the same plan, fixed.
    (func (export "fixed-plan") (result i32)
      (i32.store8 (i32.const 532) (i32.const 1))
      (i32.store8 (i32.const 533) (i32.const 1))
      (i32.store8 (i32.const 534) (i32.const 1))
      (i32.const 532))
    ;; result<permission-decision, string> at 544: ok, allow, no new input.
    (func (export "check") (param i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 544) (i32.const 0))
      (i32.store8 (i32.const 548) (i32.const 0))
      (i32.store8 (i32.const 552) (i32.const 0))
      (i32.const 544))
    ;; option<string> at 560: none.
    (func (export "none") (param i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 560) (i32.const 0))
      (i32.const 560))
    ;; string at 576: empty.
    (func (export "empty") (param i32 i32 i32 i32) (result i32)
      (i32.store (i32.const 576) (i32.const 0))
      (i32.store (i32.const 580) (i32.const 0))
      (i32.const 576))
    ;; string at 584: the name.
    (func (export "name") (param i32 i32 i32 i32) (result i32)
      (i32.store (i32.const 584) (i32.const 16))
      (i32.store (i32.const 588) (i32.const 12))
      (i32.const 584))
    ;; result<call-output, string> at 640: ok, content at 704 (one text
    ;; block, "warm"), no structured value, no context modifier.
    (func (export "call") (param i32 i32 i32 i32) (result i32)
      (i32.store8 (i32.const 704) (i32.const 0))
      (i32.store (i32.const 708) (i32.const 112)) (i32.store (i32.const 712) (i32.const 4))
      (i32.store8 (i32.const 640) (i32.const 0))
      (i32.store (i32.const 644) (i32.const 704)) (i32.store (i32.const 648) (i32.const 1))
      (i32.store8 (i32.const 652) (i32.const 0))
      (i32.store8 (i32.const 664) (i32.const 0))
      (i32.const 640))
  )
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $mem))
  (alias core export $i "realloc" (core func $realloc))

  (type $interrupt-behavior' (enum "cancel" "block"))
  (export $interrupt-behavior "interrupt-behavior" (type $interrupt-behavior'))
  (type $tool-metadata' (record
    (field "name" string)
    (field "aliases" (list string))
    (field "description" string)
    (field "prompt" string)
    (field "input-schema" string)
    (field "output-schema" (option string))
    (field "search-hint" (option string))
    (field "should-defer" bool)
    (field "always-load" bool)
    (field "strict" bool)
    (field "interrupt-behavior" $interrupt-behavior)
    (field "user-facing-name" string)))
  (export $tool-metadata "tool-metadata" (type $tool-metadata'))
  (type $permission-decision' (variant
    (case "allow" (option string))
    (case "deny" string)
    (case "ask" string)))
  (export $permission-decision "permission-decision" (type $permission-decision'))
  (type $call-plan' (record (field "concurrency-safe" bool) (field "read-only" bool)))
  (export $call-plan "call-plan" (type $call-plan'))
  (type $image' (record (field "media-type" string) (field "data" (list u8))))
  (export $image "image" (type $image'))
  (type $content-block' (variant (case "text" string) (case "image" $image)))
  (export $content-block "content-block" (type $content-block'))
  (type $call-output' (record
    (field "content" (list $content-block))
    (field "structured" (option string))
    (field "context-modifier" (option string))))
  (export $call-output "call-output" (type $call-output'))

  (func $metadata (result $tool-metadata)
    (canon lift (core func $i "metadata") (memory $mem) (realloc $realloc)))
  (func $true (result bool) (canon lift (core func $i "true")))
  (func $false (result bool) (canon lift (core func $i "false")))
  (func $false-of-inputs (param "input" string) (param "context" string) (result bool)
    (canon lift (core func $i "false-of-inputs") (memory $mem) (realloc $realloc)))
  (func $true-of-inputs (param "input" string) (param "context" string) (result bool)
    (canon lift (core func $i "true-of-inputs") (memory $mem) (realloc $realloc)))
  (func $max-result-size (result (option u64))
    (canon lift (core func $i "max-result-size") (memory $mem) (realloc $realloc)))
  (func $plan (param "input" string) (param "context" string) (result $call-plan)
    (canon lift (core func $i "plan") (memory $mem) (realloc $realloc)))
  (func $fixed-plan (result (option $call-plan))
    (canon lift (core func $i "fixed-plan") (memory $mem) (realloc $realloc)))
  (func $check (param "input" string) (param "context" string)
    (result (result $permission-decision (error string)))
    (canon lift (core func $i "check") (memory $mem) (realloc $realloc)))
  (func $none (param "input" string) (param "context" string) (result (option string))
    (canon lift (core func $i "none") (memory $mem) (realloc $realloc)))
  (func $empty (param "input" string) (param "context" string) (result string)
    (canon lift (core func $i "empty") (memory $mem) (realloc $realloc)))
  (func $name (param "input" string) (param "context" string) (result string)
    (canon lift (core func $i "name") (memory $mem) (realloc $realloc)))
  (func $inputs-equivalent (param "a" string) (param "b" string) (result bool)
    (canon lift (core func $i "false-of-inputs") (memory $mem) (realloc $realloc)))
  (func $call (param "input" string) (param "context" string)
    (result (result $call-output (error string)))
    (canon lift (core func $i "call") (memory $mem) (realloc $realloc)))

  (instance $guest
    (export "interrupt-behavior" (type $interrupt-behavior))
    (export "tool-metadata" (type $tool-metadata))
    (export "permission-decision" (type $permission-decision))
    (export "call-plan" (type $call-plan))
    (export "image" (type $image))
    (export "content-block" (type $content-block))
    (export "call-output" (type $call-output))
    (export "metadata" (func $metadata))
    (export "is-enabled" (func $true))
    (export "plan" (func $plan))
    (export "is-destructive" (func $false-of-inputs))
    (export "max-result-size" (func $max-result-size))
    (export "check" (func $check))
    (export "permission-subject" (func $none))
    (export "classifier-input" (func $empty))
    (export "user-facing-name" (func $name))
    (export "activity-description" (func $none))
    (export "is-open-world" (func $false-of-inputs))
    (export "is-search-or-read" (func $true-of-inputs))
    (export "requires-user-interaction" (func $false))
    (export "fixed-plan" (func $fixed-plan))
    (export "checks-input" (func $false))
    (export "inputs-equivalent" (func $inputs-equivalent))
    (export "call" (func $call)))
  (export "keel:tool/guest@0.4.0" (instance $guest))
)

//! The shared context a batch's calls see, and how context modifiers change it.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::contract::WORKSPACE_MOUNT;
use crate::limits::{LimitKind, human_bytes};

/// The context a batch starts with: the working directory is the workspace
/// root, as the sandbox sees it.
pub fn initial() -> Value {
    json!({ "cwd": WORKSPACE_MOUNT })
}

/// Apply a context modifier to `context` as a JSON merge patch (RFC 7396):
/// objects merge key by key, `null` removes a key, anything else replaces.
pub fn apply(context: &mut Value, patch: &Value) {
    json_patch::merge(context, patch);
    if !context.is_object() {
        *context = Value::Object(Map::new());
    }
}

/// The bytes of `value` as compact JSON text, the measure of the context
/// limit ([`Limits::context`](crate::Limits::context)).
pub fn size(value: &Value) -> usize {
    crate::run::call::json_size(value)
}

/// The result text of a call of `name` whose context modifier was refused:
/// the tool ran, but what it returned is dropped and the context is as it
/// was.
pub(crate) fn modifier_refused(name: &str, refused: &Refused) -> String {
    format!(
        "{name} failed: {refused}. The tool ran, but its output was dropped and its change to the context \
         not applied: the context is as it was"
    )
}

/// Why a context modifier was refused: applied, it would take the context
/// past its limit ([`Limits::context`](crate::Limits::context)). The context
/// is left as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The modifier, `size` bytes, is larger on its own than the limit.
    Modifier {
        /// The limit, in bytes.
        limit: usize,
        /// The modifier's size, in bytes.
        size: usize,
    },
    /// Applied, it would make the context `size` bytes.
    Context {
        /// The limit, in bytes.
        limit: usize,
        /// The size the context would have, in bytes.
        size: usize,
    },
    /// It came from a call of a concurrent run, whose changes apply when
    /// the run ends: the context, the changes of the run's calls accepted
    /// before it and its own could make the context as large as their sum.
    Run {
        /// The limit, in bytes.
        limit: usize,
        /// The context's size, in bytes.
        context: usize,
        /// The size of the run's changes accepted before it, in bytes.
        queued: usize,
        /// The modifier's size, in bytes.
        modifier: usize,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = match self {
            Refused::Modifier { limit, .. } | Refused::Context { limit, .. } | Refused::Run { limit, .. } => {
                *limit
            }
        };
        write!(f, "{} of {} exceeded: ", LimitKind::Context, human_bytes(limit))?;
        match self {
            Refused::Modifier { size, .. } => write!(f, "its context modifier is {size} bytes"),
            Refused::Context { size, .. } => {
                write!(f, "its context modifier would make the context {size} bytes")
            }
            Refused::Run { context, queued, modifier, .. } => write!(
                f,
                "its context modifier of {modifier} bytes, with the context of {context} bytes and the \
                 {queued} bytes of changes of the calls run beside it, could make the context {} bytes",
                context.saturating_add(*queued).saturating_add(*modifier)
            ),
        }
    }
}

/// The shared context, with its size, held to a limit: a modifier that
/// would take it past the limit is refused, and the context stays as it was.
///
/// The merge of a patch into a value is never larger, as compact JSON
/// text, than the two together: every byte of the result comes from one of
/// them, and the patch's braces pay for the commas its new keys add. So a
/// context of `c` bytes with changes of `q` bytes queued for it ends within
/// `c + q` bytes, whatever they hold.
#[derive(Clone, Debug)]
pub(crate) struct Bounded {
    value: Arc<Value>,
    /// Bytes of `value` as compact JSON text.
    size: usize,
    limit: usize,
}

impl Bounded {
    /// `value`, held to `limit` bytes from now on (it may start past it: a
    /// context an embedder handed in is measured, not refused).
    pub(crate) fn new(value: Value, limit: usize) -> Self {
        Bounded { size: size(&value), value: Arc::new(value), limit }
    }

    /// The context, shared with the calls that run under it.
    pub(crate) fn value(&self) -> &Arc<Value> {
        &self.value
    }

    /// The context, taken.
    pub(crate) fn into_value(self) -> Value {
        Arc::unwrap_or_clone(self.value)
    }

    /// Put `value` in the context's place, held to the same limit.
    pub(crate) fn replace(&mut self, value: Value) {
        *self = Bounded::new(value, self.limit);
    }

    /// The context, taken, leaving `null` of no size in its place.
    pub(crate) fn take(&mut self) -> Value {
        self.size = 0;
        Arc::unwrap_or_clone(std::mem::take(&mut self.value))
    }

    /// Apply `patch` now, unless the context would then pass its limit, or
    /// the patch alone does. Refused, the context is left as it was.
    pub(crate) fn apply(&mut self, patch: &Value) -> Result<(), Refused> {
        let limit = self.limit;
        let patch_size = size(patch);
        if patch_size > limit {
            return Err(Refused::Modifier { limit, size: patch_size });
        }
        if self.size.saturating_add(patch_size) <= limit {
            // It fits whatever it holds: changed in place.
            apply(Arc::make_mut(&mut self.value), patch);
            self.size = size(&self.value);
            return Ok(());
        }
        let mut next = Value::clone(&self.value);
        apply(&mut next, patch);
        let next_size = size(&next);
        if next_size > limit {
            return Err(Refused::Context { limit, size: next_size });
        }
        self.value = Arc::new(next);
        self.size = next_size;
        Ok(())
    }

    /// Whether a modifier of `patch_size` bytes may be queued behind
    /// changes of `queued` bytes, to be applied with them later
    /// ([`Bounded::apply_queued`]): only when all of them together could
    /// not take the context past its limit.
    pub(crate) fn admit_queued(&self, queued: usize, patch_size: usize) -> Result<(), Refused> {
        let limit = self.limit;
        if patch_size > limit {
            return Err(Refused::Modifier { limit, size: patch_size });
        }
        if self.size.saturating_add(queued).saturating_add(patch_size) > limit {
            return Err(Refused::Run { limit, context: self.size, queued, modifier: patch_size });
        }
        Ok(())
    }

    /// Apply `patches`, in order, each admitted by [`Bounded::admit_queued`]:
    /// together they fit, so none is refused.
    pub(crate) fn apply_queued<'a>(&mut self, patches: impl IntoIterator<Item = &'a Value>) {
        let mut patches = patches.into_iter().peekable();
        if patches.peek().is_none() {
            return;
        }
        let value = Arc::make_mut(&mut self.value);
        for patch in patches {
            apply(value, patch);
        }
        self.size = size(&self.value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modifiers_merge_in_order() {
        let mut context = initial();
        apply(&mut context, &json!({ "files_written": { "a.txt": { "bytes": 1 } } }));
        apply(
            &mut context,
            &json!({ "files_written": { "b.txt": { "bytes": 2 } }, "cwd": "/workspace/src" }),
        );
        apply(&mut context, &json!({ "files_written": { "a.txt": null } }));
        assert_eq!(context, json!({ "cwd": "/workspace/src", "files_written": { "b.txt": { "bytes": 2 } } }));
    }

    fn padded(key: &str, bytes: usize) -> Value {
        json!({ key: "x".repeat(bytes) })
    }

    #[test]
    fn a_modifier_that_would_pass_the_limit_is_refused_and_the_context_stays() {
        let mut context = Bounded::new(initial(), 1000);
        let start = context.value().clone();
        context.apply(&padded("a", 600)).unwrap();
        let before = Value::clone(context.value());
        assert_ne!(before, *start);
        let refused = context.apply(&padded("b", 600)).unwrap_err();
        let would_be = size(&before) + size(&padded("b", 600)) - 1;
        assert_eq!(refused, Refused::Context { limit: 1000, size: would_be });
        assert_eq!(
            refused.to_string(),
            format!(
                "context size limit (context_kib) of 1000 B exceeded: its context modifier would make the \
                 context {would_be} bytes"
            )
        );
        assert_eq!(**context.value(), before, "left as it was");
        assert_eq!(context.size, size(&before));
        // The same key replaced stays within the limit, though the two
        // together would not.
        context.apply(&padded("a", 700)).unwrap();
        assert_eq!(context.value()["a"].as_str().map(str::len), Some(700));
        assert_eq!(context.size, size(context.value()));
    }

    #[test]
    fn a_modifier_larger_than_the_limit_is_refused_whatever_it_would_leave() {
        let mut context = Bounded::new(json!({ "cwd": "/workspace" }), 100);
        let nulls: Map<String, Value> = (0..50).map(|i| (format!("k{i}"), Value::Null)).collect();
        let patch = Value::Object(nulls);
        let refused = context.apply(&patch).unwrap_err();
        assert_eq!(refused, Refused::Modifier { limit: 100, size: size(&patch) });
        assert_eq!(**context.value(), json!({ "cwd": "/workspace" }));
    }

    #[test]
    fn queued_modifiers_are_admitted_while_all_of_them_together_fit() {
        let mut context = Bounded::new(json!({}), 100);
        let (a, b) = (padded("a", 40), padded("b", 40));
        context.admit_queued(0, size(&a)).unwrap();
        context.admit_queued(size(&a), size(&b)).unwrap();
        let c = padded("c", 10);
        assert_eq!(
            context.admit_queued(size(&a) + size(&b), size(&c)).unwrap_err(),
            Refused::Run { limit: 100, context: 2, queued: 96, modifier: 18 }
        );
        context.apply_queued([&a, &b]);
        assert!(context.size <= 100);
        assert_eq!(context.size, size(context.value()));
    }

    #[test]
    fn a_merge_is_never_larger_than_the_context_and_the_patch_together() {
        let cases = [
            (json!({}), json!({ "a": 1 })),
            (json!({ "x": 1 }), json!({ "a": 1 })),
            (json!({ "x": 1 }), json!({ "a": {} })),
            (json!({ "a": { "x": 1 } }), json!({ "a": { "b": 1, "c": [1, 2] } })),
            (json!({ "a": 1 }), json!({ "a": { "b": null, "c": 2 } })),
            (json!({ "a": "é\"\n" }), json!({ "é\"": "x", "a": null })),
            (json!({ "a": 1 }), json!(7)),
        ];
        for (mut context, patch) in cases {
            let bound = size(&context) + size(&patch);
            apply(&mut context, &patch);
            assert!(size(&context) <= bound, "{context} from a patch {patch}");
        }
    }
}

//! The shared context a batch's calls see, and how context modifiers change it.

use serde_json::{Map, Value, json};

use crate::contract::WORKSPACE_MOUNT;

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
}

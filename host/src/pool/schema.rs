//! Input schemas, compiled once per tool.

use serde_json::Value;

/// A tool's input schema (or output schema), compiled once when the tool
/// joins the pool.
///
/// References are resolved only within the schema itself: resolving over files
/// or the network is compiled out, so a plugin cannot make the host fetch
/// anything.
pub struct InputSchema {
    validator: jsonschema::Validator,
}

/// How many schema violations one error message lists before it stops.
const MAX_REPORTED_VIOLATIONS: usize = 3;

/// Build the validators of the JSON Schema meta-schemas, which the first
/// [`InputSchema::compile`] would otherwise build (about 1 ms) before it
/// can check its schema. For a thread that has nothing else to do.
pub(crate) fn prepare_meta_schemas() {
    let _ = jsonschema::meta::is_valid(&serde_json::json!({ "type": "object" }));
}

impl InputSchema {
    /// Compile `schema`; the error says what is wrong with it.
    pub fn compile(schema: &Value) -> Result<Self, String> {
        InputSchema::compile_named(schema, "input")
    }

    /// Compile an output schema: like an input schema, it must describe an
    /// object (as MCP's `outputSchema` must).
    pub fn compile_output(schema: &Value) -> Result<Self, String> {
        InputSchema::compile_named(schema, "output")
    }

    fn compile_named(schema: &Value, which: &str) -> Result<Self, String> {
        if !schema.is_object() {
            return Err(format!("the {which} schema is not a JSON object"));
        }
        if schema.get("type").and_then(Value::as_str).is_some_and(|ty| ty != "object") {
            return Err(format!("the {which} schema does not describe an object"));
        }
        let validator = jsonschema::validator_for(schema).map_err(|error| error.to_string())?;
        Ok(InputSchema { validator })
    }

    /// Check `input`; the error names each failing path and rule, in words a
    /// model can act on: `/pattern: 5 is not of type "string" (rule: type)`.
    pub fn check(&self, input: &Value) -> Result<(), String> {
        // Most inputs are valid: the validator's yes-or-no pass collects no
        // errors, and only an input it refuses is walked again for them.
        if self.validator.is_valid(input) {
            return Ok(());
        }
        let violations: Vec<String> = self
            .validator
            .iter_errors(input)
            .map(|error| {
                let path = error.instance_path().as_str();
                let path = if path.is_empty() { "(root)" } else { path };
                format!("{path}: {error} (rule: {})", error.kind().keyword())
            })
            .collect();
        match violations.len() {
            0 => Ok(()),
            n if n <= MAX_REPORTED_VIOLATIONS => Err(violations.join("; ")),
            n => Err(format!(
                "{}; and {} more",
                violations[..MAX_REPORTED_VIOLATIONS].join("; "),
                n - MAX_REPORTED_VIOLATIONS
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> InputSchema {
        InputSchema::compile(&json!({
            "type": "object",
            "properties": {
                "pattern": { "type": "string" },
                "opts": { "type": "object", "properties": { "n": { "type": "integer", "minimum": 1 } } }
            },
            "required": ["pattern"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn names_the_failing_path_and_rule() {
        assert_eq!(
            schema().check(&json!({ "pattern": 5 })).unwrap_err(),
            r#"/pattern: 5 is not of type "string" (rule: type)"#
        );
        assert_eq!(
            schema().check(&json!({ "pattern": "x", "opts": { "n": 0 } })).unwrap_err(),
            "/opts/n: 0 is less than the minimum of 1 (rule: minimum)"
        );
    }

    #[test]
    fn a_missing_field_is_reported_at_the_root() {
        assert_eq!(
            schema().check(&json!({})).unwrap_err(),
            r#"(root): "pattern" is a required property (rule: required)"#
        );
    }

    #[test]
    fn accepts_valid_input() {
        assert_eq!(schema().check(&json!({ "pattern": "x" })), Ok(()));
    }

    #[test]
    fn refuses_a_schema_that_is_not_an_object_schema() {
        assert!(InputSchema::compile(&json!("string")).is_err());
        assert_eq!(
            InputSchema::compile(&json!({ "type": "string" })).err().unwrap(),
            "the input schema does not describe an object"
        );
    }

    #[test]
    fn does_not_fetch_remote_references() {
        let schema =
            json!({ "type": "object", "properties": { "a": { "$ref": "https://example.com/s.json" } } });
        assert!(InputSchema::compile(&schema).is_err());
    }
}

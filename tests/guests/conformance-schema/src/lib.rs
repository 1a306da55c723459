//! `json_schema_2020_12_tool`: an input schema that uses JSON Schema 2020-12
//! (`$schema`, `$defs`, `$ref`, `additionalProperties`), as the conformance
//! suite's `json-schema-2020-12` scenario asks.

use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

/// A postal address.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(rename = "address")]
pub struct Address {
    /// The street.
    pub street: Option<String>,
    /// The city.
    pub city: Option<String>,
}

/// A name and an address.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The name.
    pub name: Option<String>,
    /// The address.
    pub address: Option<Address>,
}

/// The tool.
pub struct SchemaTool;

impl Tool for SchemaTool {
    type Input = Input;
    const NAME: &str = "json_schema_2020_12_tool";
    const DESCRIPTION: &str = "Tool with JSON Schema 2020-12 features";

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        Ok(Output::text(format!("name: {:?}", input.name)))
    }
}

keel_guest::export!(SchemaTool);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_has_what_the_scenario_checks() {
        let schema = keel_guest::schema_for::<Input>();
        assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
        assert!(schema["$defs"]["address"].is_object(), "{schema}");
        assert_eq!(schema["additionalProperties"], false);
    }
}

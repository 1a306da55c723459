use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
struct Input {
    /// Who to greet.
    name: String,
}

struct Hello;
impl Tool for Hello {
    type Input = Input;
    const NAME: &str = "hello";
    const DESCRIPTION: &str = "Greets someone by name.";
    fn call(input: Input, _cx: &Context) -> Result<Output> {
        Ok(format!("Hello, {}!", input.name).into())
    }
}
keel_guest::export!(Hello);

fn main() {}

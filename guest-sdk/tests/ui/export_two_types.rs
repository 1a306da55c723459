use keel_guest::{Context, Output, Result, Tool};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
struct Input {}

struct A;
impl Tool for A {
    type Input = Input;
    const NAME: &str = "a";
    const DESCRIPTION: &str = "A.";
    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        Ok("a".into())
    }
}

struct B;
impl Tool for B {
    type Input = Input;
    const NAME: &str = "b";
    const DESCRIPTION: &str = "B.";
    fn call(_input: Input, _cx: &Context) -> Result<Output> {
        Ok("b".into())
    }
}

keel_guest::export!(A, B);

fn main() {}

keel_guest::export!(42);

fn main() {}

keel_guest::export!();

fn main() {}

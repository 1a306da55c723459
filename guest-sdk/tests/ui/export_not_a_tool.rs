struct NotATool;

keel_guest::export!(NotATool);

fn main() {}

//! Starts the test control plane, prints its folder, then panics without any
//! cleanup of its own. The teardown test runs it to prove that a panicking test
//! binary leaves no server process and no folder behind.

// This binary speaks to the person who runs it on stdout/stderr; it has
// no printer module of its own (the print lint forbids printing in libraries).
#![allow(clippy::print_stdout, clippy::print_stderr)]

fn main() {
    let env = ichor_testenv::TestEnv::shared();
    println!("{}", env.dir().display());
    panic!("the probe panics on purpose, with its control plane still running");
}

//! The integration tests of `ichor-api`, one binary (one link) for them all:
//! each former test file is a module here; shared helpers are modules too.

mod apiserver;
mod crds;
mod gitops;
mod types;

//! ichor-backup's integration tests, one binary: against the real tools and
//! the real S3-compatible server that `tools/testbin.sh` builds.

mod age_cli;
mod etcd_snapshot;
mod restore;
mod store;
mod take;

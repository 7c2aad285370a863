pub mod adopt;
pub mod cni;
pub mod controller;
pub mod init;
pub mod operation;
pub mod reclaim;
pub mod secrets;
pub mod status;

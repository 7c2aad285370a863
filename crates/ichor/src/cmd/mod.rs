pub mod adopt;
pub mod cni;
pub mod controller;
pub mod install;
pub mod operation;
pub mod secrets;
pub mod status;

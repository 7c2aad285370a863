pub mod adopt;
pub mod cni;
pub mod controller;
pub mod secrets;
pub mod status;

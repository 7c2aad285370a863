pub mod adopt;
pub mod cni;
pub mod controller;
pub mod operation;
pub mod secrets;
pub mod status;
pub mod ui;

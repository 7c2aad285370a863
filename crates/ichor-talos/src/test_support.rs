//! Test helpers: the Talos fixtures in `testdata/talos/`.
pub use ichor_testenv::fixtures::all_talos_yaml as all_yaml_fixtures;
pub use ichor_testenv::fixtures::talos as fixture;
pub use ichor_testenv::fixtures::talos_dir as fixtures_dir;

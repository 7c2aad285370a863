//! Talos node emulator (work in progress).

//! f64 reference implementations of every op, written for clarity, not speed. Every
//! backend's tests compare against these on fresh random inputs.
//!
//! (Filled in by the compute-ops work.)

//! Tensors and devices (being written).

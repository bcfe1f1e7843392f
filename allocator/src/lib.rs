//! Plimsoll's device-memory sub-allocator (being built).

//! Floods and garbage.

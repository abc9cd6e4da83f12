//! Bench and demo: the streaming backend (and, later, the reconnect benchmark).

pub mod server;

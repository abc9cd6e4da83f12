//! Every integration test, in one binary: the library and the harness are
//! linked once instead of once per file (CI compiles on 2 cores). Each
//! module is one area; `support` is the shared harness (real Envoy, the real
//! `drainshim` binary, network namespaces, clients).
//!
//! Run one area with `cargo test --test it guard_spread::`.

mod support;

mod binary;
mod config_push;
mod contract;
mod control_endpoints;
mod drain_envoy;
mod envoy_versions;
mod failopen;
mod faults_clock;
mod faults_envoy;
mod faults_recovery;
mod faults_security;
mod fleet;
mod fleet_scale;
mod fuzz_gate;
mod golden_endings;
mod golden_signals;
mod guard_abuse;
mod guard_app_shutdown;
mod guard_backpressure;
mod guard_drain;
mod guard_duplex;
mod guard_envoy;
mod guard_http1;
mod guard_http1_binary;
mod guard_kinds;
mod guard_limits;
mod guard_max_age;
mod guard_semantics;
mod guard_spread;
mod guard_websocket;
mod guard_websocket_h2;
mod guard_websocket_python;
mod layering;
mod listener_drains;
mod logs_json;
mod node_cli;
mod node_guard;
mod node_handover;
mod node_pods;
mod node_scale;
mod node_timers;
mod peer_matrix;
mod plan;
mod plan_timers;
mod prometheus;
mod prometheus_reach;
mod readiness;
mod reconnect;
mod shipping;

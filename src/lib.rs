//! drainshim: makes Envoy proxy restarts safe for long-lived gRPC streams.
//!
//! Data flows one way: trigger -> drain driver -> (Envoy admin, guard) ->
//! report -> metrics and control endpoints. See docs/design.md.
//!
//! The map of the crate, from the commands down to what everything uses:
//!
//! | part | modules | what they are |
//! |---|---|---|
//! | commands | [`cli`], [`sidecar`], [`node`], [`fleet`], [`inject`], [`check`] | the subcommands: the pod's sidecar, the node agent, the fleet tools (`inventory`, `skew`, `verify`, `plan`), injection (`inject`, `webhook`), the preflight over exported objects (`check`) |
//! | serving | [`control`], [`guard`] | the control endpoints (`/metrics`, `/drain`, health), the stream guard in front of the app (its HTTP/2 relay ends streams: `guard::relay::ending`) |
//! | the drain | [`drain`] | the pure drain machine, its driver task, the report |
//! | Envoy | [`envoy`], [`inventory`] | Envoy's admin API and its models; a proxy's identity and version |
//! | the ground | [`settings`], [`config`], [`metrics`], [`http`], [`error`], [`timer`] | validated settings and the budget's rules, the metric contract, the one HTTP client, the one error type, shared timers |
#![forbid(unsafe_code)]

pub mod check;
pub mod cli;
pub mod config;
pub mod control;
pub mod drain;
pub mod envoy;
pub mod error;
pub mod fleet;
pub mod guard;
pub mod http;
pub mod inject;
pub mod inventory;
pub mod metrics;
pub mod node;
pub mod settings;
pub mod sidecar;
pub mod timer;

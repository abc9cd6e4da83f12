//! Draining: the pure state machine, its driver task, and the report.

pub mod driver;
pub mod machine;
pub mod report;

pub use driver::{spawn, DrainHandle, DrainSettings, PushDrain, StreamGuard};
pub use machine::{Outcome, Phase, Trigger};
pub use report::{Progress, Report, Status};

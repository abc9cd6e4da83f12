//! What a chapter of the relay asks its loop to do next, instead of
//! calling another chapter itself: the calls run one way, from the loop
//! (`mod.rs`) out.

/// The relay's next step, as a chapter asks it.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Nothing more.
    Done,
    /// The client's frames already read go on now: they were held until
    /// the application's SETTINGS came, or until a flood pause ended.
    ClientFrames,
}

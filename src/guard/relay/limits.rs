//! The relay's bounds and the RFC's defaults it starts from: how much it
//! reads, buffers and decodes, and the largest frame, window and table.

/// Room made for each read.
pub(super) const READ_BUF: usize = 64 * 1024;
/// A side is not read while this much waits to be written to the other.
pub(super) const HIGH_WATER: usize = 256 * 1024;
/// Most client bytes kept while the application's SETTINGS are awaited.
pub(super) const REPLAY_MAX: usize = 64 * 1024;
/// The largest frame relayed; both peers' SETTINGS_MAX_FRAME_SIZE are
/// lowered to it, so the relay never holds more than this for one frame.
pub(super) const MAX_FRAME: u32 = 1 << 20;
/// The default SETTINGS_MAX_FRAME_SIZE (RFC 9113 §6.5.2).
pub(super) const DEFAULT_FRAME: usize = 16_384;
/// The initial flow-control window (RFC 9113 §6.9.2).
pub(super) const DEFAULT_WINDOW: u32 = 65_535;
/// While the guard cannot write for want of the client's connection window,
/// it still reads the client (for its WINDOW_UPDATEs) until this much waits.
pub(super) const BLOCKED_HIGH_WATER: usize = 4 * HIGH_WATER;
/// A decoded application header block past this is broken (or an HPACK bomb).
pub(super) const APP_BLOCK_MAX: usize = 1 << 20;
/// The largest flow-control window (RFC 9113 §6.9.1).
pub(super) const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Most bytes buffered for a local stream's task, and read from it at once.
pub(super) const LOCAL_CHUNK: usize = 16 * 1024;
/// The default SETTINGS_HEADER_TABLE_SIZE.
pub(super) const DEFAULT_TABLE: u32 = 4_096;
/// The largest HPACK table the client may build in the guard's decoder
/// (what the app allows, at most this): the guard follows the client's
/// table, so an app that allows a huge one must not let a client spend
/// the guard's memory on it.
pub(super) const MAX_CLIENT_TABLE: u32 = 64 * 1024;
/// A decoded header block this many times the header list limit is an
/// attack (an HPACK bomb): the connection is closed.
pub(super) const BOMB_FACTOR: usize = 16;
/// More CONTINUATION frames than this in one block is a flood.
pub(super) const MAX_CONTINUATIONS: usize = 64;

//! What the meter reads responses with: the longest line it parses and the wire format it
//! reads them as. The command line maps `--max-line-bytes` and `--api` onto these.

use crate::protocol::Api;

/// `--max-line-bytes`' default: 1 MiB holds the largest event an inference server sends (a
/// non-streaming answer of a long context with its logprobs), and bounds what one response
/// can make the meter hold.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;

/// How the meter reads responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `--max-line-bytes`: the longest SSE/NDJSON line (or JSON body) kept for parsing; a longer
    /// one is forwarded untouched and counted, not parsed. At least 1.
    pub max_line_bytes: usize,
    /// `--api`: the wire format every response is read as; `None` (`auto`) detects it per
    /// response.
    pub api: Option<Api>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            api: None,
        }
    }
}

//! Replicate prediction streams.
//!
//! The data of an `output` event is plain text, not JSON: the next piece the model's iterator
//! yielded, one token for language models. `done` and `error` end the stream; `done`, the
//! normal end, sets [`Summary::ended`]. Replicate reports no usage in the stream, so tokens are
//! counted events.

use super::{Api, Extractor, Message, Summary};

/// The Replicate extractor.
#[derive(Debug, Default)]
pub struct Replicate {
    summary: Summary,
}

impl Extractor for Replicate {
    fn api(&self) -> Api {
        Api::Replicate
    }

    fn on_message(&mut self, msg: &Message<'_>) -> u32 {
        if msg.event == "done" {
            self.summary.ended = true;
        }
        u32::from(msg.event == "output" && !msg.data.is_empty())
    }

    fn summary(&self) -> &Summary {
        &self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_events_with_text() {
        let mut x = Replicate::default();
        let counts: Vec<u32> = [
            ("output", ""),
            ("output", "Sure"),
            ("output", "\n\nB"),
            ("done", "{}"),
        ]
        .iter()
        .map(|(event, data)| {
            x.on_message(&Message {
                event,
                data: data.as_bytes(),
            })
        })
        .collect();
        assert_eq!(counts, [0, 1, 1, 0]);
        assert!(x.summary().ended);
    }

    #[test]
    fn the_done_event_ends_the_stream() {
        let events = [
            ("output", "Sure"),
            ("error", "{}"),
            ("output", "done"),
            ("done", "{}"),
        ];
        let ended_at = |n: usize| {
            crate::protocol::testing::ended_at(
                &mut Replicate::default(),
                events[..n].iter().copied(),
            )
        };
        assert_eq!(ended_at(4), Some(3));
        assert_eq!(ended_at(3), None);
    }
}

//! The estimate for a body over [`MAX_TOKENIZED_BYTES`]: read as JSON without being held as
//! values, and counted from the lengths of its text.
//!
//! Parsing a 10 MB body into a value tree costs several times its size in memory, and
//! rendering and tokenizing it more, for a prompt no engine context holds. Instead the body is
//! read by a visitor that keeps only lengths: the bytes of each message's text (a string
//! content, or its text parts), of each completion prompt string, and the number of token ids
//! (which are counted exactly: an id is a token). Strings are not copied (serde_json lends them
//! from the body, or from its one scratch buffer when they have escapes), so the memory is
//! bounded by the body's largest string and the time is one pass over it. Text estimates are
//! bytes / 4 ([`estimate`]), with `exact: false`; the template's own text and a completion's
//! BOS are not added. A body that is not JSON, or not the API's shape (`messages` not a list,
//! `prompt` not a string or list), is `None`, as below the limit.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::count::{estimate, Count};

/// The estimate for a body, or `None` if it is not a request of the API's shape.
pub(crate) fn prompt_tokens(chat: bool, body: &[u8]) -> Option<Count> {
    if chat {
        let request: ChatBody = serde_json::from_slice(body).ok()?;
        let bytes: usize = request.messages.iter().map(|m| m.content.0).sum();
        Some(Count {
            tokens: estimate(bytes),
            exact: false,
        })
    } else {
        let request: CompletionBody = serde_json::from_slice(body).ok()?;
        let prompt = request.prompt;
        Some(Count {
            tokens: prompt.ids + prompt.texts.iter().map(|&b| estimate(b)).sum::<u64>(),
            exact: prompt.texts.is_empty(),
        })
    }
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: TextBytes,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Prompt,
}

/// The bytes of a message's text: a string, a list of parts, or null.
#[derive(Default)]
struct TextBytes(usize);

impl<'de> Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextBytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a list of parts or null")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TextBytes, E> {
                Ok(TextBytes(s.len()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<TextBytes, E> {
                Ok(TextBytes(0))
            }
            fn visit_none<E: de::Error>(self) -> Result<TextBytes, E> {
                Ok(TextBytes(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextBytes, A::Error> {
                let mut bytes = 0usize;
                while let Some(part) = seq.next_element::<PartBytes>()? {
                    // The newline that joins parts.
                    bytes = bytes.saturating_add(part.0).saturating_add(1);
                }
                Ok(TextBytes(bytes))
            }
        }
        d.deserialize_any(V)
    }
}

/// The bytes of one content part's text: a string, or a part's `text`, `refusal` or
/// `thinking`; media parts are nothing (their tokens are not known here anyway).
struct PartBytes(usize);

impl<'de> Deserialize<'de> for PartBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PartBytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a content part")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PartBytes, E> {
                Ok(PartBytes(s.len()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PartBytes, A::Error> {
                let mut bytes = 0usize;
                while let Some(key) = map.next_key::<Key>()? {
                    if key.0 {
                        bytes = bytes.saturating_add(map.next_value::<StrBytes>()?.0);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(PartBytes(bytes))
            }
        }
        d.deserialize_any(V)
    }
}

/// A part's key: whether it is one that holds text.
struct Key(bool);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(Key(matches!(s, "text" | "refusal" | "thinking")))
            }
        }
        d.deserialize_str(V)
    }
}

/// The bytes of a string (0 for a null or anything else).
struct StrBytes(usize);

impl<'de> Deserialize<'de> for StrBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrBytes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StrBytes, E> {
                Ok(StrBytes(s.len()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<StrBytes, E> {
                Ok(StrBytes(0))
            }
        }
        d.deserialize_any(V)
    }
}

/// A completion prompt: the byte lengths of its strings and the number of its token ids.
struct Prompt {
    texts: Vec<usize>,
    ids: u64,
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a list of strings, or token ids")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Prompt, E> {
                Ok(Prompt {
                    texts: vec![s.len()],
                    ids: 0,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
                let mut prompt = Prompt {
                    texts: Vec::new(),
                    ids: 0,
                };
                while let Some(item) = seq.next_element::<Item>()? {
                    match item {
                        Item::Text(bytes) => prompt.texts.push(bytes),
                        Item::Ids(n) => prompt.ids += n,
                    }
                }
                Ok(prompt)
            }
        }
        d.deserialize_any(V)
    }
}

/// One item of a prompt list: a string, an id, or a list of ids.
enum Item {
    Text(usize),
    Ids(u64),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Item;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Item, E> {
                Ok(Item::Text(s.len()))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Item, E> {
                Ok(Item::Ids(1))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Item, E> {
                Ok(Item::Ids(1))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
                let mut n = 0u64;
                while seq.next_element::<u64>()?.is_some() {
                    n += 1;
                }
                Ok(Item::Ids(n))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    #[test]
    fn chat_text_is_estimated_from_its_bytes() {
        let body = br#"{"model": "m", "messages": [{"role": "system", "content": "abcdefgh"}, {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "image_url", "image_url": {"url": "data:..."}}]}, {"role": "assistant", "content": null}]}"#;
        // 8 + (3 + 1) + (0 + 1) = 13 bytes: 4 tokens.
        assert_eq!(
            prompt_tokens(true, body),
            Some(Count {
                tokens: 4,
                exact: false
            })
        );
        assert_eq!(prompt_tokens(true, br#"{"messages": "hi"}"#), None);
        assert_eq!(prompt_tokens(true, b"not json"), None);
    }

    #[test]
    fn completion_ids_are_counted_and_text_estimated() {
        let ids = prompt_tokens(false, br#"{"prompt": [[1, 2, 3], [4]]}"#);
        assert_eq!(
            ids,
            Some(Count {
                tokens: 4,
                exact: true
            })
        );
        let ids = prompt_tokens(false, br#"{"prompt": [5, 6]}"#);
        assert_eq!(
            ids,
            Some(Count {
                tokens: 2,
                exact: true
            })
        );
        let text = prompt_tokens(false, br#"{"prompt": ["abcde", "xy"]}"#);
        assert_eq!(
            text,
            Some(Count {
                tokens: 3,
                exact: false
            })
        );
        assert_eq!(prompt_tokens(false, br#"{"prompt": {"a": 1}}"#), None);
    }
}

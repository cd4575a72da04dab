//! The top level of a JSON message, as detection reads it: which of the keys that tell formats
//! apart it has, and the string values of `type` and `object`.
//!
//! One pass that keeps nothing else: every other value is skipped, not built. A
//! `serde_json::Value` would allocate each key and string of a first chunk (a vLLM one has a
//! dozen) only for detection to look at a few of them, once per request.
//! It accepts exactly the text `Value` accepts (the whole message must be valid JSON), and
//! where a key repeats the last one counts, as in `Value`'s map.

use std::borrow::Cow;
use std::fmt;

use serde::de::{
    self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

/// The keys whose presence tells formats apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Error,
    Role,
    Choices,
    Candidates,
    UsageMetadata,
    MetaInfo,
    TextOutput,
    ModelName,
    ModelVersion,
    Token,
    GeneratedText,
    Results,
    ModelId,
    CreatedAt,
    Done,
    Content,
    Stop,
    IdSlot,
    TokensPredicted,
    Timings,
    Message,
    FinishReason,
    Usage,
}

impl Key {
    fn of(name: &str) -> Option<Key> {
        Some(match name {
            "error" => Key::Error,
            "role" => Key::Role,
            "choices" => Key::Choices,
            "candidates" => Key::Candidates,
            "usageMetadata" => Key::UsageMetadata,
            "meta_info" => Key::MetaInfo,
            "text_output" => Key::TextOutput,
            "model_name" => Key::ModelName,
            "model_version" => Key::ModelVersion,
            "token" => Key::Token,
            "generated_text" => Key::GeneratedText,
            "results" => Key::Results,
            "model_id" => Key::ModelId,
            "created_at" => Key::CreatedAt,
            "done" => Key::Done,
            "content" => Key::Content,
            "stop" => Key::Stop,
            "id_slot" => Key::IdSlot,
            "tokens_predicted" => Key::TokensPredicted,
            "timings" => Key::Timings,
            "message" => Key::Message,
            "finish_reason" => Key::FinishReason,
            "usage" => Key::Usage,
            _ => return None,
        })
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// A message's top level.
#[derive(Debug)]
pub enum Top<'a> {
    /// An object, or an array whose first element is one (Gemini without `alt=sse`, TGI's
    /// non-streaming answer).
    Object(Shape<'a>),
    /// An empty array.
    Empty,
    /// Anything else: a string, a number, `null`, an array that starts with something else.
    Other,
}

/// One object's top level.
#[derive(Debug, Default)]
pub struct Shape<'a> {
    keys: u32,
    entries: usize,
    /// `type`, when its value is a string.
    pub kind: Option<Cow<'a, str>>,
    /// `object`, when its value is a string.
    pub object: Option<Cow<'a, str>>,
}

impl Shape<'_> {
    pub fn has(&self, key: Key) -> bool {
        self.keys & key.bit() != 0
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

/// A visitor's answer to the JSON values that are neither strings, arrays nor objects.
macro_rules! scalars_are {
    ($value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

/// Reads `data`'s top level; `None` when it is not JSON.
pub fn read(data: &[u8]) -> Option<Top<'_>> {
    serde_json::from_slice(data).ok()
}

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Level { first: false })
    }
}

/// Reads one value's top level: the message itself, or (`first`) an array's first element,
/// where only an object counts and an array inside is skipped.
#[derive(Clone, Copy)]
struct Level {
    first: bool,
}

impl<'de> DeserializeSeed<'de> for Level {
    type Value = Top<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Level {
    type Value = Top<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        shape(map).map(Top::Object)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let top = if self.first {
            Top::Other
        } else {
            match seq.next_element_seed(Level { first: true })? {
                None => Top::Empty,
                Some(Top::Object(shape)) => Top::Object(shape),
                Some(Top::Empty | Top::Other) => Top::Other,
            }
        };
        skip_seq(seq)?;
        Ok(top)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Top::Other)
    }

    scalars_are!(Top::Other);
}

/// A top-level key: one that tells formats apart, one whose value is read, or another.
enum Field {
    Known(Key),
    Kind,
    Object,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(FieldVisitor)
    }
}

struct FieldVisitor;

impl Visitor<'_> for FieldVisitor {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Field, E> {
        Ok(match name {
            "type" => Field::Kind,
            "object" => Field::Object,
            name => Key::of(name).map_or(Field::Other, Field::Known),
        })
    }
}

/// A value kept when it is a string, skipped otherwise.
struct Text<'a>(Option<Cow<'a, str>>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Borrowed(s))))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(s.to_owned()))))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Text(None))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        skip_seq(seq).map(|()| Text(None))
    }

    scalars_are!(Text(None));
}

fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn shape<'de, A: MapAccess<'de>>(mut map: A) -> Result<Shape<'de>, A::Error> {
    let mut shape = Shape::default();
    while let Some(field) = map.next_key::<Field>()? {
        shape.entries += 1;
        match field {
            Field::Known(key) => {
                shape.keys |= key.bit();
                map.next_value::<IgnoredAny>()?;
            }
            Field::Kind => shape.kind = map.next_value::<Text>()?.0,
            Field::Object => shape.object = map.next_value::<Text>()?.0,
            Field::Other => {
                map.next_value::<IgnoredAny>()?;
            }
        }
    }
    Ok(shape)
}

//! The GenAI operation a request is (`gen_ai.operation.name`), from its path or its wire
//! format, and what a request's path says before any response is read ([`Route`]).
//!
//! Known before the body is read, so a request that fails early still names its operation
//! (the OpenTelemetry names and spans need it).

use super::Api;

/// `gen_ai.operation.name`: the well-known values a request to an inference server can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A chat completion (OpenAI chat, Anthropic messages, the Responses API, Ollama's chat,
    /// Cohere's chat, watsonx's chat).
    Chat,
    /// A text completion (OpenAI's legacy completions, TGI, llama.cpp, SGLang, Triton and
    /// Ollama's generate, watsonx's text generation).
    TextCompletion,
    /// An embeddings request.
    Embeddings,
    /// Gemini's `generateContent` / `streamGenerateContent`.
    GenerateContent,
}

impl Operation {
    /// Every variant, in exposition order.
    pub const ALL: [Operation; 4] = [
        Operation::Chat,
        Operation::TextCompletion,
        Operation::Embeddings,
        Operation::GenerateContent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::TextCompletion => "text_completion",
            Operation::Embeddings => "embeddings",
            Operation::GenerateContent => "generate_content",
        }
    }

    /// The operation a request path names (the client's path, before any `--upstream` prefix),
    /// or `None` for a path that is no known GenAI route.
    pub fn of_path(path: &str) -> Option<Operation> {
        let p = path.trim_end_matches('/');
        let ends = |s: &str| p.ends_with(s);
        let op = if p.contains(":streamGenerateContent") || p.contains(":generateContent") {
            Operation::GenerateContent
        } else if p.contains(":embedContent")
            || p.contains(":batchEmbedContents")
            || ends("/embeddings")
            || ends("/embedding")
            || ends("/api/embed")
            || ends("/embed")
        {
            Operation::Embeddings
        } else if ends("/chat/completions")
            || ends("/messages")
            || ends("/responses")
            || ends("/api/chat")
            || ends("/v2/chat")
            || ends("/text/chat")
            || ends("/text/chat_stream")
        {
            Operation::Chat
        } else if ends("/completions")
            || ends("/completion")
            || ends("/api/generate")
            || ends("/generate")
            || ends("/generate_stream")
            || p.contains("/generation/text")
            || ends("/text/generation")
            || ends("/text/generation_stream")
        {
            Operation::TextCompletion
        } else {
            return None;
        };
        Some(op)
    }

    /// The usual operation of a wire format, for a response a parser read on a path that names
    /// none (`None` for a body no parser read).
    pub fn of_api(api: Api) -> Option<Operation> {
        Some(match api {
            Api::OpenAi | Api::Responses | Api::Anthropic | Api::Cohere | Api::Ollama => {
                Operation::Chat
            }
            Api::Gemini => Operation::GenerateContent,
            Api::Tgi
            | Api::LlamaCpp
            | Api::Sglang
            | Api::Triton
            | Api::Watsonx
            | Api::Replicate => Operation::TextCompletion,
            Api::Unknown => return None,
        })
    }
}

/// What a request's path says before any response is read: its GenAI operation, and the wire
/// format the path implies (which names the provider of a request that failed before its
/// response could be read). Set by the meter from the client's path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Route {
    pub operation: Option<Operation>,
    pub api: Option<Api>,
}

//! Declaring classes: the `--slo` flag's grammar, the `--slo-file` format, and the checks that
//! turn them into a [`Classes`] table.
//!
//! ```text
//! --slo NAME[:ttft=DUR][,tps=RATE][,e2e=DUR][,objective=RATIO]     (repeatable)
//! TOKENMETER_SLO="interactive:ttft=1s,tps=20;batch"                 (';'-separated)
//! ```
//!
//! The file (YAML, or TOML by its `.toml` extension) declares the same fields, plus rules that
//! put requests in a class by path prefix or model:
//!
//! ```yaml
//! classes:
//!   - {name: interactive, ttft: 1s, tps: 20}
//!   - {name: agent, ttft: 5s, tps: 60, e2e: 2m, objective: 0.99}
//!   - {name: batch}
//! rules:
//!   - {path_prefix: /v1/batches, class: batch}
//!   - {model: "llama-3.1-70b-agent*", class: agent}
//! ```
//!
//! Every problem is one line that names the flag and the fault; `config` turns it into exit 64.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use serde::Deserialize;

use super::{
    Class, Classes, Match, Rule, Targets, DEFAULT_CLASS, DEFAULT_CLASS_HEADER, MAX_CLASSES,
    MAX_CLASS_NAME, MAX_RULES,
};
use crate::host::Host;
use crate::units::parse_duration;

/// Why a class table was refused. Each message is one line naming the flag.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SloError {
    #[error("--slo {spec:?}: {why}")]
    Flag { spec: String, why: String },
    #[error("--slo-file {file}: {why}")]
    File { file: String, why: String },
    #[error("--slo-file {file}: cannot read it: {why}")]
    Unreadable { file: String, why: String },
    #[error("--slo: class {0:?} is declared twice")]
    Duplicate(String),
    #[error(
        "--slo: {0} classes declared, at most {max} are allowed (each class multiplies the series \
         of tokenmeter_slo_requests_total)",
        max = MAX_CLASSES
    )]
    TooMany(usize),
    #[error("--slo-class-header {0:?} is not a valid header name")]
    Header(String),
    #[error("--slo-default-class {0:?} is not a declared class (declared: {1})")]
    Default(String, String),
}

/// A `--slo-file`'s name (for messages and its format) and text.
#[derive(Debug, Clone, PartialEq)]
pub struct FileText {
    pub name: String,
    pub text: String,
}

impl FileText {
    /// Reads `--slo-file` through `host` (never the process's filesystem directly, so tests
    /// give the text).
    pub fn read(path: &Path, host: &dyn Host) -> Result<Self, SloError> {
        let name = path.display().to_string();
        match host.read_file(path) {
            Ok(text) => Ok(FileText { name, text }),
            Err(e) => Err(SloError::Unreadable {
                file: name,
                why: e.to_string(),
            }),
        }
    }
}

/// Everything that declares the table, as given.
#[derive(Debug, Clone, PartialEq)]
pub struct Declaration {
    /// `--slo` values, one class each.
    pub flags: Vec<String>,
    /// `--slo-file`, read.
    pub file: Option<FileText>,
    /// `--slo-class-header`.
    pub header: String,
    /// `--slo-default-class`; `None`: `interactive` if declared, else the first class.
    pub default_class: Option<String>,
}

impl Default for Declaration {
    fn default() -> Self {
        Declaration {
            flags: Vec::new(),
            file: None,
            header: DEFAULT_CLASS_HEADER.to_string(),
            default_class: None,
        }
    }
}

/// The classes when none are declared.
fn builtin() -> Vec<Class> {
    vec![
        Class {
            name: Arc::from(DEFAULT_CLASS),
            targets: Targets {
                ttft: Some(Duration::from_secs(1)),
                tps: Some(20.0),
                ..Targets::default()
            },
        },
        Class {
            name: Arc::from("batch"),
            targets: Targets::default(),
        },
    ]
}

impl Declaration {
    /// Checks everything and builds the table.
    pub fn build(&self) -> Result<Classes, SloError> {
        let mut classes = Vec::new();
        for spec in &self.flags {
            let class = parse_flag(spec).map_err(|why| SloError::Flag {
                spec: spec.clone(),
                why,
            })?;
            classes.push(class);
        }
        let mut file_rules = Vec::new();
        if let Some(f) = &self.file {
            let (c, r) = parse_file(&f.name, &f.text).map_err(|why| SloError::File {
                file: f.name.clone(),
                why,
            })?;
            classes.extend(c);
            file_rules = r;
        }
        if classes.is_empty() {
            classes = builtin();
        }
        for (i, c) in classes.iter().enumerate() {
            if classes[..i].iter().any(|d| d.name == c.name) {
                return Err(SloError::Duplicate(c.name.to_string()));
            }
        }
        if classes.len() > MAX_CLASSES {
            return Err(SloError::TooMany(classes.len()));
        }
        let declared = || {
            classes
                .iter()
                .map(|c| &*c.name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let index = |name: &str| classes.iter().position(|c| &*c.name == name);
        let mut rules = Vec::new();
        for (n, (when, class)) in file_rules.into_iter().enumerate() {
            let Some(class) = index(&class) else {
                return Err(SloError::File {
                    file: self
                        .file
                        .as_ref()
                        .map_or_else(String::new, |f| f.name.clone()),
                    why: format!(
                        "rules[{n}]: class {class:?} is not declared (declared: {})",
                        declared()
                    ),
                });
            };
            rules.push(Rule { when, class });
        }
        let header = HeaderName::from_bytes(self.header.trim().to_ascii_lowercase().as_bytes())
            .map_err(|_| SloError::Header(self.header.clone()))?;
        let default = match &self.default_class {
            Some(name) => index(name).ok_or_else(|| SloError::Default(name.clone(), declared()))?,
            None => index(DEFAULT_CLASS).unwrap_or(0),
        };
        Ok(Classes {
            classes,
            rules,
            default,
            header,
        })
    }
}

/// A class name is a label value and a header value: `[a-z][a-z0-9_-]*`, at most
/// [`MAX_CLASS_NAME`] characters, so it needs no escaping anywhere (PromQL regexes included).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= MAX_CLASS_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "class name {name:?} must be 1-{MAX_CLASS_NAME} characters of a-z, 0-9, '_' and '-', \
             starting with a letter (it becomes the class label)"
        ))
    }
}

fn positive_duration(key: &str, d: Duration) -> Result<Duration, String> {
    if d.is_zero() {
        return Err(format!("{key} must be more than 0"));
    }
    Ok(d)
}

fn rate(key: &str, v: f64) -> Result<f64, String> {
    if !(v.is_finite() && v > 0.0) {
        return Err(format!(
            "{key} must be a positive number of tokens/s, got {v}"
        ));
    }
    Ok(v)
}

fn objective(v: f64) -> Result<f64, String> {
    if !(v > 0.0 && v < 1.0) {
        return Err(format!(
            "objective must be a share between 0 and 1 (e.g. 0.95), got {v}"
        ));
    }
    Ok(v)
}

/// One `--slo` value.
pub fn parse_flag(spec: &str) -> Result<Class, String> {
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let name = name.trim();
    check_name(name)?;
    let mut t = Targets::default();
    let mut seen: Vec<&str> = Vec::new();
    for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("{item:?} is not KEY=VALUE"));
        };
        let (key, value) = (key.trim(), value.trim());
        if seen.contains(&key) {
            return Err(format!("{key} is given twice"));
        }
        seen.push(key);
        let number = || {
            value
                .parse::<f64>()
                .map_err(|_| format!("{key}: {value:?} is not a number"))
        };
        match key {
            "ttft" => t.ttft = Some(positive_duration(key, parse_duration(value)?)?),
            "e2e" => t.e2e = Some(positive_duration(key, parse_duration(value)?)?),
            "tps" => t.tps = Some(rate(key, number()?)?),
            "objective" => t.objective = objective(number()?)?,
            _ => {
                return Err(format!(
                    "unknown target {key:?} (known: ttft, tps, e2e, objective)"
                ))
            }
        }
    }
    Ok(Class {
        name: Arc::from(name),
        targets: t,
    })
}

// === the file ===

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    classes: Vec<FileClass>,
    #[serde(default)]
    rules: Vec<FileRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileClass {
    name: String,
    ttft: Option<DurationValue>,
    tps: Option<f64>,
    e2e: Option<DurationValue>,
    objective: Option<f64>,
}

/// A duration in a file: `"500ms"`, `"2m"`, or a number of seconds.
#[derive(Deserialize)]
#[serde(untagged)]
enum DurationValue {
    Seconds(f64),
    Text(String),
}

impl DurationValue {
    fn get(&self, key: &str) -> Result<Duration, String> {
        let d = match self {
            DurationValue::Seconds(s) => Duration::try_from_secs_f64(*s)
                .map_err(|_| format!("{key}: {s} is not a number of seconds"))?,
            DurationValue::Text(t) => parse_duration(t)?,
        };
        positive_duration(key, d)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRule {
    path_prefix: Option<String>,
    model: Option<String>,
    class: String,
}

/// Longest path prefix or model name in a rule.
const MAX_RULE_TEXT: usize = 1024;

/// A file's rules before their class names are looked up: (what it matches, class name).
type NamedRules = Vec<(Match, String)>;

/// Classes and rules from a file's text.
fn parse_file(name: &str, text: &str) -> Result<(Vec<Class>, NamedRules), String> {
    let lower = name.to_ascii_lowercase();
    let file: File = if lower.ends_with(".toml") {
        toml::from_str(text).map_err(|e| toml_error(text, &e))?
    } else if [".yaml", ".yml", ".json"]
        .iter()
        .any(|x| lower.ends_with(x))
    {
        serde_yaml_ng::from_str(text).map_err(|e| one_line(&e.to_string()))?
    } else {
        return Err("the name must end in .yaml, .yml or .toml (it says the format)".into());
    };
    let mut classes = Vec::new();
    for (n, c) in file.classes.into_iter().enumerate() {
        let at = |why: String| format!("classes[{n}]: {why}");
        check_name(&c.name).map_err(at)?;
        let mut t = Targets::default();
        if let Some(v) = &c.ttft {
            t.ttft = Some(v.get("ttft").map_err(at)?);
        }
        if let Some(v) = &c.e2e {
            t.e2e = Some(v.get("e2e").map_err(at)?);
        }
        if let Some(v) = c.tps {
            t.tps = Some(rate("tps", v).map_err(at)?);
        }
        if let Some(v) = c.objective {
            t.objective = objective(v).map_err(at)?;
        }
        classes.push(Class {
            name: Arc::from(c.name.as_str()),
            targets: t,
        });
    }
    if file.rules.len() > MAX_RULES {
        return Err(format!(
            "{} rules, at most {MAX_RULES} are allowed (each request tries them in order)",
            file.rules.len()
        ));
    }
    let mut rules = Vec::new();
    for (n, r) in file.rules.into_iter().enumerate() {
        let at = |why: &str| format!("rules[{n}]: {why}");
        let when = match (r.path_prefix, r.model) {
            (Some(p), None) if p.starts_with('/') && p.len() <= MAX_RULE_TEXT => {
                Match::PathPrefix(p)
            }
            (Some(_), None) => {
                return Err(at(&format!(
                    "path_prefix must start with '/' and be at most {MAX_RULE_TEXT} bytes"
                )))
            }
            (None, Some(m)) if !m.is_empty() && m.len() <= MAX_RULE_TEXT => {
                match m.strip_suffix('*') {
                    Some(prefix) => Match::ModelPrefix(prefix.to_string()),
                    None => Match::Model(m),
                }
            }
            (None, Some(_)) => return Err(at(&format!("model must be 1-{MAX_RULE_TEXT} bytes"))),
            _ => return Err(at("a rule takes exactly one of path_prefix or model")),
        };
        rules.push((when, r.class));
    }
    Ok((classes, rules))
}

/// TOML's errors quote the offending line over several lines; keep the line number and message.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    let msg = one_line(e.message());
    match line {
        Some(l) => format!("line {l}: {msg}"),
        None => msg,
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(v: &[&str]) -> Result<Classes, SloError> {
        Declaration {
            flags: v.iter().map(|s| s.to_string()).collect(),
            ..Declaration::default()
        }
        .build()
    }

    fn file(name: &str, text: &str) -> Result<Classes, SloError> {
        Declaration {
            file: Some(FileText {
                name: name.into(),
                text: text.into(),
            }),
            ..Declaration::default()
        }
        .build()
    }

    fn flag_error(spec: &str) -> String {
        match flags(&[spec]) {
            Err(SloError::Flag { why, .. }) => why,
            other => panic!("{spec}: {other:?}"),
        }
    }

    #[test]
    fn a_flag_declares_a_class_with_optional_targets() {
        let c = flags(&[
            "chat:ttft=500ms,tps=25.5,e2e=2m,objective=0.99",
            "batch",
            "bulk:",
        ])
        .expect("valid");
        let t = c.get("chat").expect("chat");
        assert_eq!(t.ttft, Some(Duration::from_millis(500)));
        assert_eq!(t.tps, Some(25.5));
        assert_eq!(t.e2e, Some(Duration::from_secs(120)));
        assert_eq!(t.objective, 0.99);
        assert_eq!(c.get("batch"), Some(&Targets::default()));
        assert_eq!(c.get("bulk"), Some(&Targets::default()));
        // No `interactive` declared: the first class is the default.
        assert_eq!(c.default_class(), "chat");
        // Declared classes replace the built-in ones.
        assert_eq!(c.get("interactive"), None);
    }

    #[test]
    fn bad_flags_name_the_fault() {
        for (spec, want) in [
            ("", "class name \"\" must be"),
            ("Chat:ttft=1s", "class name \"Chat\" must be"),
            ("9lives", "class name \"9lives\" must be"),
            ("a.b", "class name \"a.b\" must be"),
            (&"x".repeat(33), "must be 1-32 characters"),
            ("chat:ttft=soon", "\"soon\" is not a duration"),
            ("chat:ttft=0s", "ttft must be more than 0"),
            ("chat:e2e=5 fortnights", "unknown unit"),
            ("chat:tps=fast", "tps: \"fast\" is not a number"),
            ("chat:tps=0", "tps must be a positive number"),
            ("chat:tps=-3", "tps must be a positive number"),
            (
                "chat:objective=1",
                "objective must be a share between 0 and 1",
            ),
            ("chat:objective=95", "objective must be a share"),
            ("chat:ttft=1s,ttft=2s", "ttft is given twice"),
            ("chat:tpot=20ms", "unknown target \"tpot\""),
            ("chat:ttft", "\"ttft\" is not KEY=VALUE"),
        ] {
            let why = flag_error(spec);
            assert!(why.contains(want), "{spec:?}: {why}");
        }
        let e = flags(&["a:tps=1", "a:tps=2"]).expect_err("twice");
        assert_eq!(e, SloError::Duplicate("a".into()));
        let many: Vec<String> = (0..9).map(|i| format!("c{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(flags(&many).expect_err("too many"), SloError::TooMany(9));
        // The whole message is one line that names the flag and echoes the value.
        let e = flags(&["chat:tps=fast"]).expect_err("bad").to_string();
        assert_eq!(e, "--slo \"chat:tps=fast\": tps: \"fast\" is not a number");
    }

    #[test]
    fn header_and_default_class_are_checked() {
        let s = Declaration {
            header: "X-Team-Class".into(),
            default_class: Some("batch".into()),
            ..Declaration::default()
        };
        let c = s.build().expect("valid");
        assert_eq!(c.header().as_str(), "x-team-class");
        assert_eq!(c.default_class(), "batch");
        let s = Declaration {
            header: "bad header".into(),
            ..Declaration::default()
        };
        assert_eq!(s.build().err(), Some(SloError::Header("bad header".into())));
        let s = Declaration {
            default_class: Some("vip".into()),
            ..Declaration::default()
        };
        assert_eq!(
            s.build().err().map(|e| e.to_string()).as_deref(),
            Some("--slo-default-class \"vip\" is not a declared class (declared: interactive, batch)")
        );
    }

    const YAML: &str = "\
classes:
  - {name: interactive, ttft: 1s, tps: 20}
  - name: agent
    ttft: 5
    tps: 60
    e2e: 2m
    objective: 0.99
  - {name: batch}
rules:
  - {path_prefix: /v1/batches, class: batch}
  - {model: \"llama-3.1-70b-agent*\", class: agent}
";

    const TOML: &str = r#"
[[classes]]
name = "interactive"
ttft = "1s"
tps = 20

[[classes]]
name = "agent"
ttft = 5
tps = 60.0
e2e = "2m"
objective = 0.99

[[classes]]
name = "batch"

[[rules]]
path_prefix = "/v1/batches"
class = "batch"

[[rules]]
model = "llama-3.1-70b-agent*"
class = "agent"
"#;

    #[test]
    fn yaml_and_toml_files_say_the_same() {
        let y = file("slo.yaml", YAML).expect("yaml");
        let t = file("slo.toml", TOML).expect("toml");
        for c in [&y, &t] {
            let names: Vec<_> = c.iter().map(|(n, _)| n).collect();
            assert_eq!(names, ["interactive", "agent", "batch"]);
            let a = c.get("agent").expect("agent");
            assert_eq!(a.ttft, Some(Duration::from_secs(5)));
            assert_eq!(a.tps, Some(60.0));
            assert_eq!(a.e2e, Some(Duration::from_secs(120)));
            assert_eq!(a.objective, 0.99);
            assert_eq!(c.default_class(), "interactive");
            assert_eq!(
                c.rules(),
                [
                    Rule {
                        when: Match::PathPrefix("/v1/batches".into()),
                        class: 2
                    },
                    Rule {
                        when: Match::ModelPrefix("llama-3.1-70b-agent".into()),
                        class: 1
                    },
                ]
            );
        }
        assert_eq!(y.iter().collect::<Vec<_>>(), t.iter().collect::<Vec<_>>());
    }

    #[test]
    fn flags_and_file_add_up_and_may_not_repeat_a_name() {
        let s = Declaration {
            flags: vec!["chat:ttft=300ms".into()],
            file: Some(FileText {
                name: "slo.yml".into(),
                text: "classes: [{name: batch}]\n".into(),
            }),
            ..Declaration::default()
        };
        let c = s.build().expect("valid");
        assert_eq!(
            c.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            ["chat", "batch"]
        );
        let s = Declaration {
            flags: vec!["batch".into()],
            ..s
        };
        assert_eq!(s.build().err(), Some(SloError::Duplicate("batch".into())));
    }

    #[test]
    fn rules_alone_apply_to_the_builtin_classes() {
        let c = file(
            "r.yaml",
            "rules: [{path_prefix: /v1/batches, class: batch}]",
        )
        .expect("ok");
        assert_eq!(c.iter().count(), 2);
        assert_eq!(c.rules().len(), 1);
    }

    #[test]
    fn bad_files_name_the_place() {
        for (name, text, want) in [
            ("slo.conf", "", "must end in .yaml, .yml or .toml"),
            (
                "s.yaml",
                "classes: [{name: x, ttft: soon}]",
                "classes[0]: \"soon\" is not a duration",
            ),
            (
                "s.yaml",
                "classes: [{name: x, colour: red}]",
                "unknown field `colour`",
            ),
            (
                "s.yaml",
                "classes: [{name: X}]",
                "classes[0]: class name \"X\"",
            ),
            (
                "s.yaml",
                "classes: [{name: x, tps: -1}]",
                "classes[0]: tps must be a positive",
            ),
            (
                "s.yaml",
                "classes: [{name: x, objective: 2}]",
                "classes[0]: objective must be",
            ),
            (
                "s.yaml",
                "rules: [{path_prefix: v1, class: batch}]",
                "rules[0]: path_prefix must start with '/'",
            ),
            (
                "s.yaml",
                "rules: [{model: m, path_prefix: /, class: batch}]",
                "rules[0]: a rule takes exactly one",
            ),
            (
                "s.yaml",
                "rules: [{class: batch}]",
                "rules[0]: a rule takes exactly one",
            ),
            (
                "s.yaml",
                "rules: [{model: m, class: vip}]",
                "rules[0]: class \"vip\" is not declared (declared: interactive, batch)",
            ),
            ("s.yaml", "classes: {name: x}", "invalid type"),
            (
                "s.toml",
                "[[classes]]\nname = \"x\"\nttft = [1]\n",
                "line 3:",
            ),
            ("s.toml", "[[classes]\n", "line 1:"),
        ] {
            let e = file(name, text).expect_err(text).to_string();
            assert!(e.starts_with(&format!("--slo-file {name}: ")), "{e}");
            assert!(e.contains(want), "{text:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let many = format!(
            "rules:\n{}",
            "  - {path_prefix: /, class: batch}\n".repeat(MAX_RULES + 1)
        );
        let e = file("s.yaml", &many).expect_err("too many").to_string();
        assert!(e.contains("65 rules, at most 64"), "{e}");
    }
}

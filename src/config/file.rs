//! Settings read: the file strictly first (every key known, every value of
//! its key's type, the keys without a default set in it or in the
//! environment), then merged with the environment by the configuration
//! library, whose errors name their key.

use std::path::{Path, PathBuf};

use super::{ConfigError, Settings, invalid};

impl Settings {
    /// Load from an optional file, then `MODSTREAM__*` env vars, then validate.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder();
        let source = match path {
            Some(p) => {
                builder = builder.add_source(config::File::from(p).required(true));
                Some(p.to_path_buf())
            }
            None => {
                builder =
                    builder.add_source(config::File::with_name("config/modstream").required(false));
                Some(PathBuf::from("config/modstream.toml")).filter(|p| p.exists())
            }
        };
        let table = match &source {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError::File {
                    path: p.display().to_string(),
                    reason: e.to_string(),
                })?;
                check_file(Some(p), &text)?;
                text.parse::<toml::Table>().ok()
            }
            None => None,
        };
        if let Some(missing) = missing_required(source.as_deref(), table.as_ref()) {
            return Err(missing);
        }
        let built = builder
            .add_source(
                config::Environment::with_prefix("MODSTREAM")
                    .prefix_separator("__")
                    .separator("__"),
            )
            .build()?;
        let mut settings = deserialize(built, None)?;
        settings.resolve_paths(source.as_deref());
        settings.validate()?;
        settings.source = source;
        Ok(settings)
    }

    /// Parse TOML text (tests and embedded defaults), then validate.
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        check_file(None, text)?;
        let built = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()?;
        let settings = deserialize(built, None)?;
        settings.validate()?;
        Ok(settings)
    }
}

/// Keys with no default: the file or the environment must set them.
pub const REQUIRED: [(&str, &str); 2] = [
    (
        "kafka.bootstrap_servers",
        "the brokers, host:port, comma-separated",
    ),
    (
        "input.topics",
        "the topics to consume, a list or one comma-separated string",
    ),
];

/// The file alone, strictly: TOML, every key known, every value of its
/// key's type (the configuration library reads `review_at = "0.5"` as a
/// number; a file that says so is a mistake worth naming). Required keys it
/// leaves to the environment get stand-ins here.
pub(super) fn check_file(path: Option<&Path>, text: &str) -> Result<(), ConfigError> {
    let file = path.map_or_else(String::new, |p| p.display().to_string());
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: file.clone(),
            reason: e.to_string(),
        })?;
    for (key, _) in REQUIRED {
        let (section, name) = key.split_once('.').unwrap_or(("", key));
        let toml::Value::Table(t) = table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        else {
            continue;
        };
        t.entry(name)
            .or_insert_with(|| toml::Value::String("stand-in".into()));
    }
    deserialize(toml::Value::Table(table), path).map(|_| ())
}

/// Settings from the file's table or the merged configuration, an error
/// naming the key by its path (serde_path_to_error: no error text read),
/// and the file where there is one.
fn deserialize<'de, D>(from: D, file: Option<&Path>) -> Result<Settings, ConfigError>
where
    D: serde::Deserializer<'de>,
    D::Error: std::fmt::Display,
{
    serde_path_to_error::deserialize::<_, Settings>(from).map_err(|e| {
        // The key as written (`inference.execution_providers`, not its
        // element `[1]`); "." where the error is about no one key.
        let path = e.path().to_string();
        let key = path
            .trim_end_matches(|c: char| c == ']' || c == '[' || c.is_ascii_digit())
            .to_string();
        // A type error shows the value: not where it may be a secret.
        let message = if super::is_secret(&key) {
            "a value of the wrong type (not shown: it may be a secret)".to_string()
        } else {
            in_words(e.into_inner().to_string().trim())
        };
        let reason = match file {
            Some(file) => format!("{message} (in {})", file.display()),
            None => message,
        };
        if key == "." {
            ConfigError::Unreadable(reason)
        } else {
            invalid(&key, reason)
        }
    })
}

/// serde's names of Rust's number types, in the words of the person who
/// wrote the file: `expected f32` is "expected a number".
fn in_words(message: &str) -> String {
    // The file's parser adds "in `key`" on a line of its own: the key is
    // named before the message already.
    let message = match message.rsplit_once('\n') {
        Some((first, last)) if last.starts_with("in `") => first.trim_end(),
        _ => message,
    };
    const WORDS: [(&str, &str); 12] = [
        ("f32", "a number"),
        ("f64", "a number"),
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("u16", "a whole number"),
        ("u8", "a whole number"),
        ("isize", "a whole number"),
        ("i64", "a whole number"),
        ("i32", "a whole number"),
        ("i16", "a whole number"),
        ("i8", "a whole number"),
    ];
    let Some((before, after)) = message.split_once("expected ") else {
        return message.to_string();
    };
    let end = after
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(after.len());
    match WORDS.iter().find(|(ty, _)| *ty == &after[..end]) {
        Some((_, words)) => format!("{before}expected {words}{}", &after[end..]),
        None => message.to_string(),
    }
}

/// A required key that neither the file nor the environment sets.
pub(super) fn missing_required(
    path: Option<&Path>,
    table: Option<&toml::Table>,
) -> Option<ConfigError> {
    for (key, what) in REQUIRED {
        let (section, name) = key.split_once('.').unwrap_or(("", key));
        let in_file = table
            .and_then(|t| t.get(section))
            .and_then(|s| s.get(name))
            .is_some();
        let env = format!(
            "MODSTREAM__{}__{}",
            section.to_uppercase(),
            name.to_uppercase()
        );
        if !in_file && std::env::var_os(&env).is_none() {
            let file = path.map_or_else(
                || "no configuration file".to_string(),
                |p| format!("not set in {}", p.display()),
            );
            return Some(invalid(
                key,
                format!("required: {what} ({file}, nor in {env})"),
            ));
        }
    }
    None
}

//! librdkafka properties passed through (`kafka.consumer`,
//! `kafka.producer`): nested TOML tables become dotted names, and secret
//! values never show in `Debug` output or dumps.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// librdkafka properties passed through. Values of secret properties
/// (passwords, keys, secrets) never appear in `Debug` output or config dumps.
#[derive(Clone, Default, PartialEq)]
pub struct Properties(pub BTreeMap<String, String>);

impl std::ops::Deref for Properties {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Whether a librdkafka property holds a secret.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "ssl.key.pem",
        "ssl_key",
        "sasl.oauthbearer.config",
    ]
    .iter()
    .any(|s| key.contains(s))
}

pub const REDACTED: &str = "<redacted>";

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Properties {
    /// The properties with secret values replaced by [`REDACTED`].
    pub fn redacted(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    if is_secret(k) {
                        REDACTED.to_string()
                    } else {
                        v.clone()
                    },
                )
            })
            .collect()
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.redacted()).finish()
    }
}

/// Serialized (config dumps) with secrets redacted.
impl Serialize for Properties {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.redacted().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        properties(d).map(Properties)
    }
}

/// librdkafka properties: values may be strings, numbers or booleans; keys
/// from env vars spell dots as underscores (`FETCH_WAIT_MAX_MS`) or nest
/// (`MODSTREAM__KAFKA__CONSUMER__SASL__PASSWORD` is `sasl.password`), and a
/// nested TOML table is read the same way. An error never shows a value:
/// it may be a secret.
fn properties<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
    let mut out = BTreeMap::new();
    for (k, v) in raw {
        flatten_property(&k.replace('_', "."), v, &mut out).map_err(serde::de::Error::custom)?;
    }
    Ok(out)
}

/// A property whose value is not a string, number or boolean (the value
/// itself is not shown: it may be a secret).
#[derive(Debug, thiserror::Error)]
#[error("property {key}: expected a string, number or boolean, got {got}")]
struct NotAProperty {
    key: String,
    got: &'static str,
}

fn flatten_property(
    key: &str,
    value: serde_json::Value,
    out: &mut BTreeMap<String, String>,
) -> Result<(), NotAProperty> {
    let value = match value {
        serde_json::Value::String(s) => s,
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Object(nested) => {
            for (k, v) in nested {
                flatten_property(&format!("{key}.{}", k.replace('_', ".")), v, out)?;
            }
            return Ok(());
        }
        serde_json::Value::Array(_) => {
            return Err(NotAProperty {
                key: key.to_string(),
                got: "a list",
            });
        }
        serde_json::Value::Null => {
            return Err(NotAProperty {
                key: key.to_string(),
                got: "nothing",
            });
        }
    };
    out.insert(key.to_string(), value);
    Ok(())
}

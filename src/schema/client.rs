//! A small client of the Confluent Schema Registry API (also served by
//! Apicurio at `/apis/ccompat/v7`, Redpanda and Karapace): a schema by id,
//! a subject's version (for references), and registering a schema.

use std::time::Duration;

use serde::Deserialize;

use crate::config::SchemaRegistrySettings;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The registry answered that there is no such schema.
    #[error("the registry has no schema {0}")]
    NotFound(String),
    /// No answer, or not one about the schema (5xx, refused credentials):
    /// not the record's fault.
    #[error("schema registry unreachable: {0}")]
    Unreachable(String),
}

/// Why the registry's client cannot be made (a configuration error).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("schema_registry.url is not set")]
    NoUrl,
    #[error("schema_registry.ca_location {}: {error}", path.display())]
    Ca {
        path: std::path::PathBuf,
        error: String,
    },
    #[error("the HTTP client: {0}")]
    Http(#[source] reqwest::Error),
}

/// A schema as the registry returns it.
#[derive(Debug, Clone, Deserialize)]
pub struct RegistrySchema {
    pub schema: String,
    /// `AVRO` when absent.
    #[serde(default, rename = "schemaType")]
    pub schema_type: Option<String>,
    #[serde(default)]
    pub references: Vec<Reference>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Reference {
    /// The name the referring schema imports it by.
    pub name: String,
    pub subject: String,
    pub version: i64,
}

#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    base: String,
    auth: Option<(String, String)>,
}

impl RegistryClient {
    pub fn new(settings: &SchemaRegistrySettings) -> Result<RegistryClient, ClientError> {
        let base = settings
            .url
            .clone()
            .ok_or(ClientError::NoUrl)?
            .trim_end_matches('/')
            .to_string();
        let mut http = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .connect_timeout(settings.request_timeout.min(Duration::from_secs(5)));
        if let Some(path) = &settings.ca_location {
            let ca_error = |error: String| ClientError::Ca {
                path: path.clone(),
                error,
            };
            let pem = std::fs::read(path).map_err(|e| ca_error(e.to_string()))?;
            let ca = reqwest::Certificate::from_pem(&pem).map_err(|e| ca_error(e.to_string()))?;
            http = http.add_root_certificate(ca);
        }
        let http = http.build().map_err(ClientError::Http)?;
        let auth = settings.username.clone().zip(settings.password.clone());
        Ok(RegistryClient { http, base, auth })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header(
                "Accept",
                "application/vnd.schemaregistry.v1+json, application/json",
            );
        match &self.auth {
            Some((user, password)) => r.basic_auth(user, Some(password)),
            None => r,
        }
    }

    /// The schema of a schema id.
    pub async fn schema_by_id(&self, id: u32) -> Result<RegistrySchema, FetchError> {
        self.get(&format!("/schemas/ids/{id}"), &format!("id {id}"))
            .await
    }

    /// A version of a subject (what a reference names).
    pub async fn subject_version(
        &self,
        subject: &str,
        version: i64,
    ) -> Result<RegistrySchema, FetchError> {
        let path = format!("/subjects/{}/versions/{version}", encode(subject));
        self.get(&path, &format!("{subject} version {version}"))
            .await
    }

    async fn get(&self, path: &str, what: &str) -> Result<RegistrySchema, FetchError> {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(e.to_string()))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(FetchError::NotFound(what.to_string()));
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(FetchError::Unreachable(format!(
                "{status} for {what}: {}",
                body.chars().take(200).collect::<String>()
            )));
        }
        response.json::<RegistrySchema>().await.map_err(|e| {
            FetchError::Unreachable(format!("the answer for {what} is not a schema: {e}"))
        })
    }

    /// Register `schema` under `subject` (the registry returns the id it
    /// already has for the same schema).
    pub async fn register(
        &self,
        subject: &str,
        schema: &str,
        schema_type: &str,
    ) -> Result<u32, FetchError> {
        #[derive(Deserialize)]
        struct Registered {
            id: u32,
        }
        let body = serde_json::json!({"schema": schema, "schemaType": schema_type});
        let path = format!("/subjects/{}/versions", encode(subject));
        let response = self
            .request(reqwest::Method::POST, &path)
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(FetchError::Unreachable(format!(
                "registering under {subject}: {status}: {}",
                text.chars().take(300).collect::<String>()
            )));
        }
        response
            .json::<Registered>()
            .await
            .map(|r| r.id)
            .map_err(|e| FetchError::Unreachable(format!("registering under {subject}: {e}")))
    }
}

/// A subject name in a URL path.
fn encode(subject: &str) -> String {
    subject
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

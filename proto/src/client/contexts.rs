//! The contexts file: named servers with their tokens and default tenancy, so operators switch
//! clusters with `--context NAME` (or `resctl context use NAME`) instead of retyping flags.
//!
//! Location: `$RESCTL_CONFIG` if set, else `$XDG_CONFIG_HOME/resctl/contexts.yaml`, else
//! `~/.config/resctl/contexts.yaml`.
//!
//! ```yaml
//! current: prod
//! contexts:
//!   prod: {server: 10.0.0.5:8502, token: s3cret, namespace: default,
//!          ca_cert: /etc/resd/resd-ca.pem, client_cert: ~/ops.pem, client_key: ~/ops-key.pem}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// TLS: the CA certificate file (turns TLS on), and the client certificate and key files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
    /// How long each call may take (`10s`, `2m`), retries included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextsFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, ContextEntry>,
}

/// A path with a leading `~/` expanded to the home directory (contexts store such paths).
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

/// Where the contexts file lives (it need not exist).
pub fn path() -> Option<PathBuf> {
    crate::contexts_path()
}

/// What went wrong with the contexts file, naming it.
#[derive(Debug, thiserror::Error)]
pub enum ContextsError {
    #[error("cannot read contexts file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("contexts file {path} is not valid: {error}")]
    Invalid {
        path: PathBuf,
        error: serde_yaml_ng::Error,
    },
    #[error("cannot write contexts file {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}")]
    Unknown(String),
}

impl ContextsFile {
    /// Reads the file; a missing file is an empty one.
    pub fn load(path: &Path) -> Result<ContextsFile, ContextsError> {
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => Ok(ContextsFile::default()),
            Ok(text) => serde_yaml_ng::from_str(&text).map_err(|error| ContextsError::Invalid {
                path: path.to_path_buf(),
                error,
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Ok(ContextsFile::default())
            }
            Err(error) => Err(ContextsError::Read {
                path: path.to_path_buf(),
                error,
            }),
        }
    }

    /// Writes the file atomically (temp file + rename), readable only by its owner since it
    /// holds tokens.
    pub fn save(&self, path: &Path) -> Result<(), ContextsError> {
        let failed = |error: std::io::Error| ContextsError::Write {
            path: path.to_path_buf(),
            error,
        };
        let directory = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(directory).map_err(failed)?;
        let text = serde_yaml_ng::to_string(self).map_err(|error| ContextsError::Invalid {
            path: path.to_path_buf(),
            error,
        })?;
        let mut file = tempfile::NamedTempFile::new_in(directory).map_err(failed)?;
        std::io::Write::write_all(&mut file, text.as_bytes()).map_err(failed)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(failed)?;
        }
        file.persist(path).map_err(|error| failed(error.error))?;
        Ok(())
    }

    /// The context to use: the named one (which must exist), else the current one, else none.
    pub fn select(
        &self,
        name: Option<&str>,
    ) -> Result<Option<(String, ContextEntry)>, ContextsError> {
        match name.or(self.current.as_deref()) {
            None => Ok(None),
            Some(name) => match self.contexts.get(name) {
                Some(entry) => Ok(Some((name.to_owned(), entry.clone()))),
                None if self.contexts.is_empty() => Err(ContextsError::Unknown(format!(
                    "context {name:?} does not exist: the contexts file has none yet; create it with `resctl context set {name} --to-server HOST:PORT`"
                ))),
                None => Err(ContextsError::Unknown(format!(
                    "context {name:?} does not exist; known contexts: {}",
                    self.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
                ))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_file_loads_back_and_selects_the_current_context() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("nested").join("contexts.yaml");
        assert_eq!(ContextsFile::load(&path).unwrap(), ContextsFile::default());
        let mut file = ContextsFile::default();
        file.contexts.insert(
            "prod".into(),
            ContextEntry {
                server: Some("10.0.0.5:8502".into()),
                token: Some("secret".into()),
                ..Default::default()
            },
        );
        file.current = Some("prod".into());
        file.save(&path).unwrap();
        let loaded = ContextsFile::load(&path).unwrap();
        assert_eq!(loaded, file);
        let (name, entry) = loaded.select(None).unwrap().unwrap();
        assert_eq!(name, "prod");
        assert_eq!(entry.server.as_deref(), Some("10.0.0.5:8502"));
    }

    #[test]
    fn an_unknown_context_lists_the_known_ones() {
        let mut file = ContextsFile::default();
        file.contexts.insert("dev".into(), ContextEntry::default());
        let error = file.select(Some("prod")).unwrap_err().to_string();
        assert!(error.contains("known contexts: dev"), "{error}");
    }
}

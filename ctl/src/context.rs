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

use anyhow::{Context as _, bail};
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
    proto::contexts_path()
}

impl ContextsFile {
    /// Reads the file; a missing file is an empty one.
    pub fn load(path: &Path) -> anyhow::Result<ContextsFile> {
        match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => Ok(ContextsFile::default()),
            Ok(text) => serde_yaml_ng::from_str(&text)
                .with_context(|| format!("contexts file {} is not valid", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                Ok(ContextsFile::default())
            }
            Err(error) => {
                Err(error).with_context(|| format!("cannot read contexts file {}", path.display()))
            }
        }
    }

    /// Writes the file atomically (temp file + rename), readable only by its owner since it
    /// holds tokens.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let directory = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(directory)
            .with_context(|| format!("cannot create {}", directory.display()))?;
        let text = serde_yaml_ng::to_string(self)?;
        let mut file = tempfile::NamedTempFile::new_in(directory)?;
        std::io::Write::write_all(&mut file, text.as_bytes())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            file.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        file.persist(path)
            .with_context(|| format!("cannot write contexts file {}", path.display()))?;
        Ok(())
    }

    /// The context to use: the named one (which must exist), else the current one, else none.
    pub fn select(&self, name: Option<&str>) -> anyhow::Result<Option<(String, ContextEntry)>> {
        match name.or(self.current.as_deref()) {
            None => Ok(None),
            Some(name) => match self.contexts.get(name) {
                Some(entry) => Ok(Some((name.to_owned(), entry.clone()))),
                None if self.contexts.is_empty() => bail!(
                    "context {name:?} does not exist: the contexts file has none yet; create it with `resctl context set {name} --to-server HOST:PORT`"
                ),
                None => bail!(
                    "context {name:?} does not exist; known contexts: {}",
                    self.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
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

//! The files a configuration names (models, the policy, lists, the
//! runtime library, a CA), found the same way by every subcommand: a
//! relative path is taken as given where it exists (from the directory the
//! command runs in), else beside the configuration file, else under the
//! repository this binary was built in (the shipped defaults, such as
//! `models/profanity-check`, from any directory). A path found nowhere is
//! left as written, so that the error which reads it names it as the user
//! wrote it.

use std::path::{Path, PathBuf};

use super::Settings;

/// As given where it exists, else under the repository this binary was
/// built in (target/release/modstream is two levels below it).
pub fn beside_the_binary(path: &Path) -> PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    let exe = std::env::current_exe().ok();
    let found = exe
        .iter()
        .flat_map(|e| e.ancestors().skip(1).take(4))
        .map(|dir| dir.join(path))
        .find(|p| p.exists());
    found.unwrap_or_else(|| path.to_path_buf())
}

/// As given where it exists, else beside the configuration file (in
/// `config_dir`), else [`beside_the_binary`].
pub fn resolve(path: &Path, config_dir: Option<&Path>) -> PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    if let Some(dir) = config_dir {
        let beside = dir.join(path);
        if beside.exists() {
            return beside;
        }
    }
    beside_the_binary(path)
}

impl Settings {
    /// Every file path of these settings, resolved by [`resolve`].
    pub(super) fn resolve_paths(&mut self, config_file: Option<&Path>) {
        let dir = config_file.and_then(Path::parent);
        let fix = |p: &mut PathBuf| *p = resolve(p, dir);
        let inference = &mut self.inference;
        fix(&mut inference.model_dir);
        inference
            .models
            .iter_mut()
            .for_each(|m| fix(&mut m.model_dir));
        inference.shadow.model_dir.iter_mut().for_each(fix);
        inference.runtime_library.iter_mut().for_each(fix);
        self.policy.file.iter_mut().for_each(fix);
        self.matching
            .lists
            .iter_mut()
            .for_each(|l| fix(&mut l.file));
        self.schema_registry.ca_location.iter_mut().for_each(fix);
    }
}

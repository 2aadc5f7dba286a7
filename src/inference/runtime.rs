//! Finding and loading the ONNX Runtime library (once per process), and
//! registering the configured execution providers on a session.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::InferenceError;
use crate::config::{ExecutionProvider, InferenceSettings, MemoryArena};

/// Where the ONNX Runtime library is: `ORT_DYLIB_PATH`, then
/// `inference.runtime_library`, then the cache that
/// `scripts/fetch-onnxruntime.sh` fills.
pub fn find_runtime_library(settings: &InferenceSettings) -> Result<PathBuf, InferenceError> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        candidates.push(PathBuf::from(p));
    } else if let Some(p) = &settings.runtime_library {
        candidates.push(p.clone());
    } else {
        candidates.push(default_cache_dir().join("onnxruntime-1.31.1/libonnxruntime.so.1.31.1"));
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| InferenceError::RuntimeMissing {
            looked_at: candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// `$MODSTREAM_CACHE_DIR`, else `$XDG_CACHE_HOME/modstream`, else `~/.cache/modstream`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MODSTREAM_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("modstream");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/modstream")
}

/// Load ONNX Runtime once per process.
pub(super) fn environment(
    settings: &InferenceSettings,
) -> Result<&'static ort::environment::Environment, InferenceError> {
    static ENV: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();
    let path = find_runtime_library(settings)?;
    let env = ENV.get_or_init(|| {
        ort::init_from(&path)
            .map_err(|e| e.to_string())?
            .with_name("modstream")
            .build()
            .map_err(|e| e.to_string())
    });
    env.as_ref().map_err(|message| InferenceError::RuntimeLoad {
        path,
        message: message.clone(),
    })
}

/// Register the configured execution providers in order; the first one that
/// registers runs the session (CPU takes whatever it cannot). A GPU provider
/// that cannot be used is an error with `require_gpu`, else a warning.
pub(super) fn register_providers(
    builder: &mut ort::session::builder::SessionBuilder,
    settings: &InferenceSettings,
    kind: crate::inference::manifest::InputKind,
) -> Result<&'static str, InferenceError> {
    let arena = match settings.session.memory_arena {
        MemoryArena::On => true,
        MemoryArena::Off => false,
        MemoryArena::Auto => kind == crate::inference::manifest::InputKind::Text,
    };
    let mut chosen = None;
    let mut failures = Vec::new();
    for provider in &settings.execution_providers {
        let ep = match provider {
            ExecutionProvider::Cuda => ort::ep::CUDA::default()
                .with_device_id(settings.device_id)
                .build(),
            ExecutionProvider::Tensorrt => ort::ep::TensorRT::default()
                .with_device_id(settings.device_id)
                .with_fp16(settings.fp16)
                .build(),
            ExecutionProvider::Cpu => {
                ort::ep::CPU::default()
                    .with_arena_allocator(arena)
                    .build()
                    .register(builder)
                    .map_err(|e| InferenceError::SessionOption(e.to_string()))?;
                chosen.get_or_insert("CPUExecutionProvider");
                break;
            }
        };
        match ep.register(builder) {
            Ok(()) => {
                chosen.get_or_insert(ep.name());
            }
            Err(e) => failures.push(format!("{}: {e}", provider.name())),
        }
    }
    let gpu = chosen.is_some_and(|c| c != "CPUExecutionProvider");
    if !failures.is_empty() && settings.require_gpu && !gpu {
        return Err(InferenceError::GpuUnavailable(failures.join("; ")));
    }
    if !failures.is_empty() {
        tracing::warn!(failed = %failures.join("; "), "execution provider unavailable; falling back");
    }
    let chosen = chosen.unwrap_or("CPUExecutionProvider");
    if settings.fp16 && chosen != "TensorrtExecutionProvider" {
        tracing::warn!(
            provider = chosen,
            "inference.fp16 applies to TensorRT only; this session runs the model's own precision"
        );
    }
    Ok(chosen)
}

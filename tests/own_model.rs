//! docs/own-model.md run as a user pastes it: its command blocks in order,
//! through bash, in an empty directory, with what a test must change: the
//! built binary for `target/release/modstream`, the repository's paths for
//! the script and the built MiniLM folder, and the modstream cache's Python
//! (it has onnxruntime and onnx) for the venv the page creates (tests
//! install nothing). The export block needs the Hugging Face hub, which
//! this machine cannot reach; the page says so, and it is not run.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The page's command blocks: runs of indented lines outside fences.
fn blocks(page: &str) -> Vec<Vec<String>> {
    let (mut blocks, mut block, mut fenced) = (Vec::new(), Vec::new(), false);
    for line in page.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        match line.strip_prefix("    ") {
            Some(command) if !fenced => block.push(command.to_string()),
            _ if !block.is_empty() => blocks.push(std::mem::take(&mut block)),
            _ => {}
        }
    }
    if !block.is_empty() {
        blocks.push(block);
    }
    blocks
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MODSTREAM_CACHE_DIR") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"),
        PathBuf::from,
    );
    base.join("modstream")
}

/// `quant/bin/python` in `dir`: the cache's venv that
/// scripts/build-minilm-model.sh made (a venv, or a --target directory).
fn quant_python(dir: &Path) {
    let venv = cache_dir().join("py-venv");
    assert!(
        venv.join(".complete").exists(),
        "{} missing: scripts/test.sh runs scripts/build-minilm-model.sh first",
        venv.display()
    );
    let bin = dir.join("quant/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let v = venv.display();
    let wrapper = format!(
        "#!/bin/sh\nif [ -x \"{v}/bin/python\" ]; then exec \"{v}/bin/python\" \"$@\"; fi\nPYTHONPATH=\"{v}/site\" exec python3 \"$@\"\n"
    );
    std::fs::write(bin.join("python"), wrapper).unwrap();
    Command::new("chmod")
        .args(["+x"])
        .arg(bin.join("python"))
        .status()
        .unwrap();
}

/// A block through bash in `dir`, stopping at the first failing line,
/// bounded in time; its stdout and stderr together.
fn run(lines: &[String], dir: &Path) -> String {
    let root = support::repo_root();
    let script = lines
        .iter()
        .map(|l| {
            l.replace("target/release/modstream", env!("CARGO_BIN_EXE_modstream"))
                .replace(
                    "scripts/build-minilm-model.sh",
                    &root
                        .join("scripts/build-minilm-model.sh")
                        .display()
                        .to_string(),
                )
                .replace(
                    " models/minilm-l6/",
                    &format!(" {}/", root.join("models/minilm-l6").display()),
                )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let out = Command::new("timeout")
        .args(["300", "bash", "-c", &format!("set -e\nexec 2>&1\n{script}")])
        .current_dir(dir)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{script}\n{said}");
    said
}

/// The lines a command printed in one of docs/own-model's output files.
fn recorded(file: &str, command: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(support::repo_root().join("docs/own-model").join(file)).unwrap();
    let start = text
        .find(&format!("$ {command}\n"))
        .unwrap_or_else(|| panic!("{file} records {command:?}"));
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("# exit"))
        .map(str::to_string)
        .collect()
}

/// The lines of `said` that name a text: its verdict and the text.
fn verdicts<'a>(said: &'a str, texts: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    said.lines()
        .filter_map(|l| {
            let text = texts.iter().find(|t| l.ends_with(*t))?;
            Some((l.split_whitespace().next()?, *text))
        })
        .collect()
}

#[test]
fn the_own_model_page_runs_as_pasted() {
    let page = std::fs::read_to_string(support::repo_root().join("docs/own-model.md")).unwrap();
    let mut blocks = blocks(&page);
    assert_eq!(blocks.len(), 6, "the page's command blocks: {blocks:#?}");
    assert!(blocks[0][0].contains("optimum"), "{:?}", blocks[0]);
    let dir = tempfile::tempdir().unwrap();

    // 2. The stand-in for an exported folder.
    run(&blocks[1], dir.path());
    assert!(dir.path().join("my-model/tokenizer.json").exists());

    // 3. Quantized with the cache's onnxruntime, not a new venv.
    let venv = blocks[2]
        .iter()
        .position(|l| l.starts_with("python3 -m venv quant"))
        .expect("the page makes a venv named quant");
    blocks[2].remove(venv);
    quant_python(dir.path());
    run(&blocks[2], dir.path());
    assert!(dir.path().join("my-model-int8/model.onnx").exists());

    // 4. The manifests, said as docs/own-model/init-model.txt records.
    let said = run(&blocks[3], dir.path());
    let expected: Vec<String> = blocks[3]
        .iter()
        .flat_map(|c| recorded("init-model.txt", c))
        .collect();
    assert_eq!(said.lines().collect::<Vec<_>>(), expected, "{said}");
    let manifest = |path: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    assert_eq!(
        manifest(&dir.path().join("my-model/manifest.json")),
        manifest(&support::repo_root().join("docs/own-model/manifest.json")),
    );

    // 5. Both graphs judge the page's texts as its record says.
    let texts = ["you are all wonderful", "shut up you stupid idiot"];
    let said = run(&blocks[4], dir.path());
    let recorded_verdicts: Vec<String> = blocks[4]
        .iter()
        .flat_map(|c| recorded("check-model.txt", c))
        .collect();
    let recorded_verdicts = recorded_verdicts.join("\n");
    let got = verdicts(&said, &texts);
    assert_eq!(got.len(), 4, "{said}");
    assert_eq!(got, verdicts(&recorded_verdicts, &texts), "{said}");
    assert_eq!(got[0].0, "allow");
    assert_eq!(got[1].0, "block");

    // 6. The demo on the int8 folder: every valid post judged.
    let said = run(&blocks[5], dir.path());
    assert!(
        said.contains("verdicts         1485 of 1485 valid"),
        "{said}"
    );
}

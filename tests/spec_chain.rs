//! `compile` and `chain` come from one set of specs (sbx-spec): the
//! configuration `compile` prints, given to each tool with --config, parses
//! to the same spec as the argv `chain` runs, both read by the tools' own
//! clap types; and each spec's argv parses back to the spec.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use sbx_policy::chain::{self, Options, Trust};

fn os(s: impl AsRef<std::ffi::OsStr>) -> OsString {
    s.as_ref().to_os_string()
}

/// A tool's argv as chain renders it, with the command after `--`.
fn with_cmd(layer: &[OsString]) -> Vec<OsString> {
    let mut v = layer.to_vec();
    v.extend([os("--"), os("true")]);
    v
}

/// The tool as `--config FILE -- true` (its section of compile's output).
fn from_config<C: clap::Parser>(tool: &'static str, sub: Option<&str>, file: &Path) -> C {
    let mut argv = vec![os(tool)];
    argv.extend(sub.map(os));
    argv.extend([os("--config"), os(file), os("--"), os("true")]);
    sbx_core::cli::parse_from::<C>(tool, argv).unwrap_or_else(|e| panic!("{tool}: {}", e.message))
}

fn net_spec(c: sbx_net::Cli) -> sbx_spec::NetSpec {
    c.spec
}

fn gitguard_run(c: sbx_gitguard::Cli) -> sbx_spec::GitguardRunSpec {
    match c.command {
        sbx_gitguard::Command::Run(a) => a.spec,
        other => panic!("not run: {other:?}"),
    }
}

/// A git project with file, network and Bash rules.
fn project() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().canonicalize().unwrap().join("proj");
    let home = d.path().canonicalize().unwrap().join("home");
    std::fs::create_dir_all(root.join(".claude")).unwrap();
    std::fs::create_dir_all(root.join("secret")).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let ok = Command::new("git")
        .args(["init", "-q"])
        .arg(&root)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::write(
        root.join(".claude/settings.json"),
        r#"{"permissions": {"allow": ["Bash(make:*)", "Bash(sh:*)", "WebFetch(domain:example.com)"],
                            "deny": ["Read(./secret/**)"]},
            "sandbox": {"network": {"allowedDomains": ["pypi.org"]}}}"#,
    )
    .unwrap();
    (d, root, home)
}

#[test]
fn compile_fed_to_the_tools_equals_chain() {
    let (d, root, home) = project();
    for mode in ["invoke", "strict"] {
        let cli = sbx_policy::Cli::try_parse_from([
            os("sbx-policy"),
            os("compile"),
            os("--chdir"),
            os(&root),
            os("--home"),
            os(&home),
            os("--exec-allowlist"),
            os(mode),
        ])
        .unwrap();
        let sbx_policy::Command::Compile(src) = cli.command else {
            unreachable!()
        };
        let p = sbx_policy::policy(&src).unwrap();
        let cfg = d.path().join(format!("{mode}.json"));
        std::fs::write(
            &cfg,
            serde_json::to_string(&p.to_config().unwrap()).unwrap(),
        )
        .unwrap();
        let cmd = [os("sh"), os("-c"), os("make")];
        let opts = Options {
            trust: Trust::Low,
            latency_sensitive: false,
            plugin: false,
            layers: None,
            bin_dir: sbx_testutil::bin("sbx-fs").parent().map(Path::to_path_buf),
            cgroup: Some(true),
            container: false,
            secrets: Vec::new(),
        };
        let plan = chain::plan(&p, &opts, &cmd).unwrap();
        assert_eq!(plan.layers.last().unwrap(), &cmd.to_vec());
        let mut seen = Vec::new();
        for layer in &plan.layers[..plan.layers.len() - 1] {
            let name = Path::new(&layer[0])
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let argv = with_cmd(layer);
            match name.as_str() {
                "sbx-fs" => {
                    let mut ran = sbx_fs::Cli::try_parse_from(&argv).unwrap().spec;
                    // The git stage is made per run: compile has none.
                    assert!(ran.git_stage.take().is_some(), "{argv:?}");
                    let compiled = from_config::<sbx_fs::Cli>("sbx-fs", None, &cfg).spec;
                    assert_eq!(ran, compiled, "{mode}");
                    assert!(!ran.rw.is_empty() && ran.git_identity, "{ran:?}");
                    let back = sbx_fs::Cli::try_parse_from(with_cmd(
                        &[vec![os("sbx-fs")], ran.args()].concat(),
                    ))
                    .unwrap();
                    assert_eq!(back.spec, ran);
                }
                "sbx-seccomp" => {
                    let ran = sbx_seccomp::Cli::try_parse_from(&argv).unwrap().spec;
                    let compiled = from_config::<sbx_seccomp::Cli>("sbx-seccomp", None, &cfg).spec;
                    assert_eq!(ran, compiled, "{mode}");
                    // Strict mode: the kernel execute allowlist holds the
                    // shell and make, in both (they once disagreed).
                    let names: Vec<String> = ran
                        .allow_exec
                        .iter()
                        .filter_map(|x| x.file_name().map(|n| n.to_string_lossy().into_owned()))
                        .collect();
                    if mode == "strict" {
                        assert!(names.iter().any(|n| n == "sh" || n == "dash"), "{names:?}");
                    } else {
                        assert!(names.is_empty(), "{names:?}");
                    }
                }
                "sbx-net" => {
                    let ran = net_spec(sbx_net::Cli::try_parse_from(&argv).unwrap());
                    let compiled = net_spec(from_config::<sbx_net::Cli>("sbx-net", None, &cfg));
                    assert_eq!(ran, compiled, "{mode}");
                    assert!(ran.allow.iter().any(|a| a == "example.com"), "{ran:?}");
                    let back = net_spec(
                        sbx_net::Cli::try_parse_from(with_cmd(
                            &[vec![os("sbx-net")], ran.args()].concat(),
                        ))
                        .unwrap(),
                    );
                    assert_eq!(back, ran);
                }
                "sbx-cgroup" => {
                    let ran = sbx_cgroup::Cli::try_parse_from(&argv).unwrap().spec;
                    // compile holds every limit; chain those that apply
                    // here: equal where the cgroup limits apply (root).
                    if ran.memory.is_some() {
                        let compiled =
                            from_config::<sbx_cgroup::Cli>("sbx-cgroup", None, &cfg).spec;
                        assert_eq!(ran, compiled, "{mode}");
                    }
                }
                "sbx-gitguard" if layer[1] == "run" => {
                    let mut ran = gitguard_run(sbx_gitguard::Cli::try_parse_from(&argv).unwrap());
                    assert!(ran.stage.take().is_some(), "{argv:?}");
                    let compiled = gitguard_run(from_config::<sbx_gitguard::Cli>(
                        "sbx-gitguard",
                        Some("run"),
                        &cfg,
                    ));
                    assert_eq!(ran, compiled, "{mode}");
                    assert_eq!(ran.repo.repo, root);
                }
                "sbx-gitguard" => assert_eq!(layer[1], "plants"),
                _ => {}
            }
            seen.push(name);
        }
        for t in ["sbx-gitguard", "sbx-net", "sbx-fs", "sbx-seccomp"] {
            assert!(seen.iter().any(|s| s == t), "{t} not in {seen:?}");
        }
    }
}

/// The zero-trust chain's last layer is sbx-gvisor, read by its own clap
/// type: the same grants as the namespace chain's sbx-fs, the execute
/// allowlist of its sbx-seccomp, sbx-net's namespace (`--host-network`),
/// and argv that parses back to the spec.
#[test]
fn zero_trust_renders_what_sbx_gvisor_parses() {
    if chain::find_tool("runsc", None).is_none() {
        sbx_testutil::skip!("runsc not installed (scripts/setup installs Debian's runsc)");
    }
    let (_d, root, home) = project();
    let cli = sbx_policy::Cli::try_parse_from([
        os("sbx-policy"),
        os("compile"),
        os("--chdir"),
        os(&root),
        os("--home"),
        os(&home),
        os("--exec-allowlist"),
        os("strict"),
    ])
    .unwrap();
    let sbx_policy::Command::Compile(src) = cli.command else {
        unreachable!()
    };
    let p = sbx_policy::policy(&src).unwrap();
    let cmd = [os("sh"), os("-c"), os("make")];
    let opts = |trust| Options {
        trust,
        latency_sensitive: false,
        plugin: false,
        layers: None,
        bin_dir: sbx_testutil::bin("sbx-fs").parent().map(Path::to_path_buf),
        cgroup: Some(true),
        container: false,
        secrets: Vec::new(),
    };
    let zero = chain::plan(&p, &opts(Trust::Zero), &cmd).unwrap();
    let low = chain::plan(&p, &opts(Trust::Low), &cmd).unwrap();
    let layer = |plan: &chain::Plan, tool: &str| {
        plan.layers
            .iter()
            .find(|l| Path::new(&l[0]).file_name().is_some_and(|n| n == tool))
            .unwrap_or_else(|| panic!("no {tool} layer"))
            .clone()
    };
    let gv = layer(&zero, "sbx-gvisor");
    assert!(
        !zero.layers.iter().any(|l| l.iter().any(|w| w == "gvisor")),
        "no sbx-policy gvisor step any more"
    );
    let ran = sbx_gvisor::Cli::try_parse_from(with_cmd(&gv)).unwrap().spec;
    let fs = sbx_fs::Cli::try_parse_from(with_cmd(&layer(&low, "sbx-fs")))
        .unwrap()
        .spec;
    let seccomp = sbx_seccomp::Cli::try_parse_from(with_cmd(&layer(&low, "sbx-seccomp")))
        .unwrap()
        .spec;
    assert_eq!(
        (&ran.rw, &ran.ro, &ran.deny, &ran.pass_env, &ran.chdir),
        (&fs.rw, &fs.ro, &fs.deny, &fs.pass_env, &fs.chdir)
    );
    assert_eq!(ran.tmp_size, fs.tmp_size);
    assert_eq!(ran.allow_exec, seccomp.allow_exec);
    assert!(!ran.allow_exec.is_empty());
    assert!(ran.host_network && ran.runsc.is_file(), "{ran:?}");
    // compile's sbx-gvisor section: the same, without the per-run parts.
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("compiled.json");
    std::fs::write(
        &cfg,
        serde_json::to_string(&p.to_config().unwrap()).unwrap(),
    )
    .unwrap();
    let compiled = from_config::<sbx_gvisor::Cli>("sbx-gvisor", None, &cfg).spec;
    assert_eq!(
        compiled,
        sbx_spec::GvisorSpec {
            cgroup_bin: None,
            git_stage: None,
            ..ran.clone()
        }
    );
    assert!(!compiled.allow_exec.is_empty());
    let back =
        sbx_gvisor::Cli::try_parse_from(with_cmd(&[vec![os("sbx-gvisor")], ran.args()].concat()))
            .unwrap();
    assert_eq!(back.spec, ran);
}

/// The tiers of one tool (sbx-vm, sbx-container, sbx-wasm): `chain`
/// renders the spec sbx-policy fills, the tool's own Cli parses it back to
/// that spec, `compile`'s section for the tool is the same spec, and a
/// --layers section reaches the tool as --config.
#[test]
fn one_tool_tiers_render_their_specs_and_compile_has_them() {
    let (d, root, home) = project();
    let cli = sbx_policy::Cli::try_parse_from([
        os("sbx-policy"),
        os("compile"),
        os("--chdir"),
        os(&root),
        os("--home"),
        os(&home),
    ])
    .unwrap();
    let sbx_policy::Command::Compile(src) = cli.command else {
        unreachable!()
    };
    let p = sbx_policy::policy(&src).unwrap();
    let cfg = d.path().join("compiled.json");
    std::fs::write(
        &cfg,
        serde_json::to_string(&p.to_config().unwrap()).unwrap(),
    )
    .unwrap();
    let layers = d.path().join("layers.json");
    std::fs::write(
        &layers,
        r#"{"sbx-vm": {"vcpus": 2}, "sbx-container": {"init": true}, "sbx-wasm": {"fuel": 1000}}"#,
    )
    .unwrap();
    let cmd = [os("true")];
    let opts = |trust, latency_sensitive, container| Options {
        trust,
        latency_sensitive,
        plugin: false,
        layers: Some(layers.clone()),
        bin_dir: sbx_testutil::bin("sbx-vm").parent().map(Path::to_path_buf),
        cgroup: None,
        container,
        secrets: Vec::new(),
    };

    let plan = chain::plan(&p, &opts(Trust::Zero, true, false), &cmd).unwrap();
    assert_eq!(plan.layers.len(), 2, "{:?}", plan.layers);
    let layer = &plan.layers[0];
    assert!(Path::new(&layer[0]).ends_with("sbx-vm"), "{layer:?}");
    let want = sbx_spec::VmSpec {
        backend: sbx_spec::vm::Backend::Firecracker,
        ..chain::vm_spec(&p)
    };
    assert_eq!(want.copy_in.as_deref(), Some(root.as_path()));
    // Without the --config section: exactly what chain built.
    let ran = sbx_vm::Cli::try_parse_from(with_cmd(&layer[..layer.len() - 2]))
        .unwrap()
        .spec;
    assert_eq!(ran, want);
    // compile's section: the same, but for the latency-sensitive backend.
    let compiled = from_config::<sbx_vm::Cli>("sbx-vm", None, &cfg).spec;
    assert_eq!(
        sbx_spec::VmSpec {
            backend: want.backend,
            ..compiled
        },
        want
    );
    // With it (the last two words): the section's settings on top.
    assert_eq!(
        layer[layer.len() - 2..],
        sbx_core::cli::config_args(&layers)
    );
    let merged = sbx_core::cli::parse_from::<sbx_vm::Cli>("sbx-vm", with_cmd(layer))
        .unwrap_or_else(|e| panic!("{}", e.message))
        .spec;
    assert_eq!(merged, sbx_spec::VmSpec { vcpus: 2, ..want });

    let plan = chain::plan(&p, &opts(Trust::Low, false, true), &cmd).unwrap();
    assert_eq!(plan.layers.len(), 2, "{:?}", plan.layers);
    let layer = &plan.layers[0];
    assert!(Path::new(&layer[0]).ends_with("sbx-container"), "{layer:?}");
    let want = chain::container_spec(&p);
    assert_eq!(want.net, Some(sbx_spec::container::Net::None));
    assert!(!want.rw.is_empty() && want.memory.is_some(), "{want:?}");
    let ran = sbx_container::Cli::try_parse_from(with_cmd(&layer[..layer.len() - 2]))
        .unwrap()
        .spec;
    assert_eq!(ran, want);
    let compiled = from_config::<sbx_container::Cli>("sbx-container", None, &cfg).spec;
    assert_eq!(compiled, want);
    let merged = sbx_core::cli::parse_from::<sbx_container::Cli>("sbx-container", with_cmd(layer))
        .unwrap_or_else(|e| panic!("{}", e.message))
        .spec;
    assert_eq!(merged, sbx_spec::ContainerSpec { init: true, ..want });

    let plan = chain::plan(&p, &opts(Trust::Plugin, false, false), &[os("plugin.wasm")]).unwrap();
    assert_eq!(plan.layers.len(), 2, "{:?}", plan.layers);
    let layer = &plan.layers[0];
    assert!(Path::new(&layer[0]).ends_with("sbx-wasm"), "{layer:?}");
    let want = chain::wasm_spec(&p).0;
    assert!(!want.rw.is_empty() && !want.allow.is_empty(), "{want:?}");
    let ran = sbx_wasm::Cli::try_parse_from(with_cmd(&layer[..layer.len() - 2]))
        .unwrap()
        .spec;
    assert_eq!(ran, want);
    let compiled = from_config::<sbx_wasm::Cli>("sbx-wasm", None, &cfg).spec;
    assert_eq!(compiled, want);
    let merged = sbx_core::cli::parse_from::<sbx_wasm::Cli>("sbx-wasm", with_cmd(layer))
        .unwrap_or_else(|e| panic!("{}", e.message))
        .spec;
    assert_eq!(merged.fuel, Some(1000), "{merged:?}");
}

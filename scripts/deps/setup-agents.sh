# The real agents (sourced by scripts/setup, bash, as root): Claude Code,
# Codex and, for scripts/bench-agents, Anthropic's sandbox-runtime (srt),
# pinned, from the npm registry into their own prefix /opt/sbx-agents
# (bin/claude, bin/codex, bin/srt; world-readable, so the test user runs
# them too). Not on PATH: tests/agents.rs and scripts/bench-agents take
# them from $SBX_AGENTS (default /opt/sbx-agents), and grant that prefix
# read-only inside the sandbox as a user grants their own npm prefix.
# Both CLIs ship native binaries (Claude Code's bin/claude.exe, Codex's
# vendor/x86_64-unknown-linux-musl/bin/codex behind a node wrapper).
sbx_agents_setup() {
    local prefix=/opt/sbx-agents
    local pkgs="@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 @anthropic-ai/sandbox-runtime@0.0.83"
    local stamp=$prefix/.sbx-packages
    if [ "$pkgs" != "$(cat "$stamp" 2>/dev/null)" ] || ! "$prefix/bin/claude" --version >/dev/null 2>&1 ||
        ! "$prefix/bin/codex" --version >/dev/null 2>&1; then
        # Debian's nodejs comes without npm (NodeSource's includes it).
        if ! command -v npm >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
        fi
        # shellcheck disable=SC2086 # one word per package
        npm install -g --prefix "$prefix" --no-fund --no-audit --loglevel=error $pkgs
        # Claude Code's postinstall links its platform binary over the
        # placeholder bin/claude.exe; check it did.
        "$prefix/bin/claude" --version >/dev/null
        "$prefix/bin/codex" --version >/dev/null
        chmod -R a+rX "$prefix"
        printf '%s' "$pkgs" >"$stamp"
        echo "setup: $("$prefix/bin/claude" --version), $("$prefix/bin/codex" --version), srt $("$prefix/bin/srt" --version) in $prefix"
    fi
}
sbx_agents_setup

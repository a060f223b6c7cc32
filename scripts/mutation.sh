#!/usr/bin/env bash
# Mutation testing of the modules that judge (`make mutation`; not part of CI).
#
# A test suite that passes proves little until it is shown to fail on wrong
# code. mutmut plants one small bug at a time (a flipped comparison, a changed
# constant, a dropped argument) and runs the unit tests that cover the module;
# a mutant the tests do not notice is a bug they would let through.
#
#   scripts/mutation.sh                      every judging module, one after another
#   scripts/mutation.sh orchestrator/stats.py payload/scrub.py
#   make mutation MODULES="orchestrator/analysis/regress.py"   the same, through make
#   MUTATION_TESTS="tests/unit/test_cost.py" scripts/mutation.sh orchestrator/analysis/cost.py
#   MUTATION_MIN=90 MUTATION_OUT=DIR scripts/mutation.sh
#   MUTATION_JOBS=2 scripts/mutation.sh ...   mutants run two at a time (default 1)
#   MUTATION_SURVIVORS=DIR scripts/mutation.sh MODULE   only the mutants that survived in
#                                            DIR/<module>.txt of an earlier run, against HEAD's tests
#   MUTATION_ONLY="orchestrator.parsers.system.x_parse_*" scripts/mutation.sh MODULE
#                                            only the mutants of the functions these globs name
#                                            (mutmut's names), scored on their own
#
# mutmut rewrites source files, so everything runs in a temporary clone of HEAD
# (committed code only; the working tree is never touched). One worker, since
# the development machines are small. Per module it writes DIR/<module>.txt
# (the surviving mutants as diffs) and prints a table of kill ratios; docs/
# reliability.md says which survivors were judged harmless and why. Exit 1 when
# the overall ratio is below MUTATION_MIN percent. With MUTATION_SURVIVORS the
# earlier run's killed mutants are counted as killed (tests were only added), so
# the ratio printed is the module's new score.
set -euo pipefail

ROOT=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
PY=${PY:-$ROOT/.venv/bin/python}
OUT=${MUTATION_OUT:-$ROOT/results/mutation}
MIN=${MUTATION_MIN:-90}
JOBS=${MUTATION_JOBS:-1}
PRIOR=${MUTATION_SURVIVORS:-}
ONLY=${MUTATION_ONLY:-}

# module -> the unit tests that exercise it (mutmut runs, per mutant, only those
# of them that reach the mutated function). Property tests (hypothesis) are left
# out: their draws differ from run to run, and a mutant's fate must not. An entry
# may hold pytest options as single words (`--deselect=NODE`): the statistical
# tests of test_regress.py (hundreds of seeded runs, 40 s together) are left out
# so that a module takes minutes; test_mutation_pins_significance.py pins the
# same code on exact values instead.
REGRESS_FAST="tests/unit/test_regress.py
    --deselect=tests/unit/test_regress.py::test_a_5_percent_drop_at_2_percent_cv_is_detected_with_the_stated_counts
    --deselect=tests/unit/test_regress.py::test_stationary_runs_raise_false_alarms_below_alpha
    --deselect=tests/unit/test_regress.py::test_without_a_minimum_effect_bh_alone_holds_alpha
    --deselect=tests/unit/test_regress.py::test_without_correction_the_same_runs_would_cry_wolf"
TRAIN_TESTS="tests/unit/test_mutation_pins_train.py tests/unit/test_mutation_pins_train_restart.py tests/unit/test_train_judge.py tests/unit/test_train_command.py"
declare -A TESTS=(
    [orchestrator/analysis/significance.py]="tests/unit/test_mutation_pins_significance.py $REGRESS_FAST"
    [orchestrator/analysis/regress.py]="tests/unit/test_mutation_pins_regress.py tests/unit/test_mutation_pins_significance.py $REGRESS_FAST tests/unit/test_baseline.py tests/unit/test_prom.py"
    [orchestrator/analysis/compare.py]="tests/unit/test_mutation_pins_compare.py tests/unit/test_compare.py tests/unit/test_compare_cli.py tests/unit/test_verdict.py"
    [orchestrator/analysis/cost.py]="tests/unit/test_mutation_pins_cost_tables.py tests/unit/test_mutation_pins_cost.py tests/unit/test_mutation_pins_billing.py tests/unit/test_cost.py tests/unit/test_compare.py tests/unit/test_compare_cli.py"
    [orchestrator/analysis/billing.py]="tests/unit/test_mutation_pins_billing.py tests/unit/test_mutation_pins_cost.py tests/unit/test_mutation_pins_cost_tables.py tests/unit/test_cost.py tests/unit/test_compare.py tests/unit/test_compare_cli.py"
    [orchestrator/analysis/verdict.py]="tests/unit/test_mutation_pins_verdict.py tests/unit/test_verdict.py tests/unit/test_poc_recipe.py tests/unit/test_compare.py"
    [orchestrator/steps/train/command.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/failures.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/judge.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/memory.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/reading.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/restore.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/throughput.py]="$TRAIN_TESTS"
    [orchestrator/steps/train/step.py]="tests/unit/test_mutation_pins_train_step.py tests/unit/test_train_plan.py tests/unit/test_train_h200_capture.py $TRAIN_TESTS"
    [orchestrator/stats.py]="tests/unit/test_stats.py tests/unit/test_bands.py"
    [orchestrator/bands.py]="tests/unit/test_bands.py tests/unit/test_stats.py"
    [orchestrator/store.py]="tests/unit/test_mutation_pins_store.py tests/unit/test_inventory_scrub.py tests/unit/test_store.py tests/unit/test_resume.py tests/unit/test_import_cli.py tests/unit/test_baseline.py"
    [orchestrator/files.py]="tests/unit/test_mutation_pins_store.py tests/unit/test_inventory_scrub.py tests/unit/test_store.py tests/unit/test_resume.py tests/unit/test_import_cli.py tests/unit/test_baseline.py"
    [orchestrator/index.py]="tests/unit/test_mutation_pins_store.py tests/unit/test_inventory_scrub.py tests/unit/test_store.py tests/unit/test_resume.py tests/unit/test_import_cli.py tests/unit/test_baseline.py"
    [orchestrator/steps/nccl/judge.py]="tests/unit/test_mutation_pins_nccl_judge.py tests/unit/test_nccl_judge.py tests/unit/test_gpu_capture.py tests/unit/test_import_cli.py"
    [orchestrator/collectdoc.py]="tests/unit/test_mutation_pins_collectdoc.py tests/unit/test_preflight.py"
    [orchestrator/verdicts.py]="tests/unit/test_mutation_pins_verdicts.py tests/unit/test_resume.py tests/unit/test_import_cli.py"
    [payload/scrub.py]="tests/unit/test_mutation_pins_scrub.py tests/unit/payload/test_scrub.py tests/unit/test_store.py"
    [payload/scrub_names.py]="tests/unit/test_mutation_pins_scrub.py tests/unit/payload/test_scrub.py tests/unit/test_secret_forms.py"
    [payload/ncclbuild.py]="tests/unit/test_mutation_pins_ncclbuild.py tests/unit/test_ncclbuild.py"
    [orchestrator/gpunames.py]="tests/unit/test_gpunames.py tests/unit/test_checks.py tests/unit/test_mutation_pins_checks2.py tests/unit/test_bands.py"
    [orchestrator/steps/preflight/checks.py]="tests/unit/test_mutation_pins_checks.py tests/unit/test_mutation_pins_checks2.py tests/unit/test_checks.py tests/unit/test_preflight.py"
    [orchestrator/steps/preflight/facts.py]="tests/unit/test_mutation_pins_checks.py tests/unit/test_mutation_pins_checks2.py tests/unit/test_checks.py tests/unit/test_preflight.py"
    [orchestrator/steps/preflight/gpu.py]="tests/unit/test_mutation_pins_checks.py tests/unit/test_mutation_pins_checks2.py tests/unit/test_checks.py tests/unit/test_preflight.py"
    [orchestrator/steps/preflight/links.py]="tests/unit/test_mutation_pins_checks.py tests/unit/test_mutation_pins_checks2.py tests/unit/test_checks.py tests/unit/test_preflight.py"
    [orchestrator/parsers/dmon.py]="tests/unit/parsers/test_dmon.py"
    [orchestrator/parsers/gpus.py]="tests/unit/parsers/test_gpus.py"
    [orchestrator/parsers/ibstat.py]="tests/unit/parsers/test_ibstat.py"
    [orchestrator/parsers/nccl_debug.py]="tests/unit/test_mutation_pins_nccl_debug.py tests/unit/test_mutation_pins_nccl_parsers.py tests/unit/parsers/test_nccl_debug.py"
    [orchestrator/parsers/nccl_tests.py]="tests/unit/test_mutation_pins_nccl_text.py tests/unit/test_mutation_pins_nccl_json.py tests/unit/test_mutation_pins_nccl_parsers.py tests/unit/parsers/test_nccl_tests.py tests/unit/parsers/test_nccl_tests_wild.py"
    [orchestrator/parsers/_nccl_common.py]="tests/unit/test_mutation_pins_nccl_common.py tests/unit/test_mutation_pins_nccl_json.py tests/unit/test_mutation_pins_nccl_parsers.py tests/unit/parsers/test_nccl_tests.py tests/unit/parsers/test_nccl_tests_wild.py tests/unit/parsers/test_nccl_debug.py"
    [orchestrator/parsers/_nccl_tests_json.py]="tests/unit/test_mutation_pins_nccl_json.py tests/unit/test_mutation_pins_nccl_parsers.py tests/unit/parsers/test_nccl_tests.py"
    [orchestrator/parsers/nvidia_smi.py]="tests/unit/test_mutation_pins_smi_csv.py tests/unit/parsers/test_nvidia_smi.py tests/unit/parsers/test_nvidia_smi_wild.py tests/unit/parsers/test_mutation_pins_nvidia_smi.py"
    [orchestrator/parsers/nvidia_smi_q.py]="tests/unit/test_mutation_pins_smi_q.py tests/unit/test_mutation_pins_smi_tree.py tests/unit/parsers/test_nvidia_smi_q.py tests/unit/parsers/test_nvidia_smi_wild.py tests/unit/parsers/test_mutation_pins_nvidia_smi_q.py"
    [orchestrator/parsers/nvidia_smi_table.py]="tests/unit/test_mutation_pins_smi_table.py tests/unit/parsers/test_nvidia_smi_table.py tests/unit/parsers/test_nvidia_smi_wild.py tests/unit/parsers/test_mutation_pins_nvidia_smi_table.py"
    [orchestrator/parsers/nvidia_smi_xml.py]="tests/unit/test_mutation_pins_smi_xml.py tests/unit/parsers/test_nvidia_smi.py tests/unit/parsers/test_nvidia_smi_q.py tests/unit/parsers/test_nvidia_smi_wild.py tests/unit/parsers/test_mutation_pins_nvidia_smi_xml.py"
    [orchestrator/parsers/system.py]="tests/unit/parsers/test_system.py tests/unit/parsers/test_mutation_pins_system.py"
    [orchestrator/parsers/topology.py]="tests/unit/parsers/test_topology.py tests/unit/parsers/test_mutation_pins_topology.py"
    [orchestrator/parsers/_noise.py]="tests/unit/test_mutation_pins_noise.py tests/unit/test_mutation_pins_nccl_parsers.py tests/unit/parsers/test_noise.py tests/unit/parsers/test_nccl_tests_wild.py"
    [orchestrator/parsers/_smi_tree.py]="tests/unit/test_mutation_pins_smi_tree.py tests/unit/parsers/test_nvidia_smi_q.py tests/unit/parsers/test_nvidia_smi.py tests/unit/parsers/test_nvidia_smi_wild.py"
    [orchestrator/parsers/dcgmi.py]="tests/unit/parsers/test_dcgmi.py"
    [orchestrator/parsers/kernel_log.py]="tests/unit/parsers/test_kernel_log.py tests/unit/parsers/test_mutation_pins_kernel_log.py"
    [orchestrator/parsers/lspci.py]="tests/unit/parsers/test_lspci.py"
    [orchestrator/parsers/nvbandwidth.py]="tests/unit/parsers/test_nvbandwidth.py"
    [orchestrator/parsers/nvidia_smi_health.py]="tests/unit/test_mutation_pins_smi_health.py tests/unit/parsers/test_nvidia_smi_health.py tests/unit/parsers/test_mutation_pins_nvidia_smi_health.py"
    [orchestrator/parsers/p2p_latency.py]="tests/unit/parsers/test_p2p_latency.py"
    [orchestrator/parsers/perftest.py]="tests/unit/parsers/test_perftest.py"
    [orchestrator/parsers/recipe.py]="tests/unit/parsers/test_recipe.py tests/unit/test_gpu_state.py tests/unit/parsers/test_mutation_pins_recipe.py"
)
# Functions left out of a module (marked `# pragma: no mutate` in the clone only).
# ncclbuild's source fetching and archive extraction are guarded by their own
# tests and the archive fault tests.
declare -A SKIP=(
    [payload/ncclbuild.py]="safe_extract fetch_source"
)
ORDER=(orchestrator/stats.py orchestrator/bands.py orchestrator/files.py orchestrator/index.py
       orchestrator/store.py orchestrator/steps/nccl/judge.py
       orchestrator/collectdoc.py orchestrator/verdicts.py payload/scrub.py payload/ncclbuild.py
       orchestrator/gpunames.py orchestrator/steps/preflight/checks.py
       orchestrator/steps/preflight/facts.py orchestrator/steps/preflight/gpu.py
       orchestrator/steps/preflight/links.py
       orchestrator/analysis/significance.py orchestrator/analysis/regress.py
       orchestrator/analysis/compare.py orchestrator/analysis/verdict.py
       orchestrator/analysis/cost.py orchestrator/analysis/billing.py orchestrator/steps/train/*.py orchestrator/parsers/*.py)

if [ $# -gt 0 ]; then modules=("$@"); else modules=("${ORDER[@]}"); fi
cd "$ROOT"
# MUTATION_TESTS: the tests for every module of this run instead of those listed
# (a quicker subset while writing tests; the scores in docs/reliability.md use the list)
if [ -n "${MUTATION_TESTS:-}" ]; then
    for m in "${modules[@]}"; do TESTS[$m]=$MUTATION_TESTS; done
fi
for m in "${modules[@]}"; do
    case "$m" in */__init__.py) continue ;; esac
    if [ -z "${TESTS[$m]:-}" ]; then
        echo "mutation: no tests listed for $m; known: ${!TESTS[*]}" >&2
        exit 2
    fi
done
"$PY" -c 'import mutmut' 2>/dev/null || {
    echo "mutation: mutmut is not installed in $PY (make setup installs the dev extra)" >&2; exit 2; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/gpuvet-mutation.XXXXXX")
# MUTATION_KEEP=1 leaves the clone (and mutmut's mutants/ of the last module) in place,
# to re-run its survivors after tests were added: `cd CLONE && mutmut run NAME...`
if [ -n "${MUTATION_KEEP:-}" ]; then
    trap 'echo "mutation: the clone stays in $TMP/src"' EXIT
else
    trap 'rm -rf "$TMP"' EXIT
fi
git clone -q --no-hardlinks "$ROOT" "$TMP/src"
mkdir -p "$OUT"
echo "mutation: HEAD $(git -C "$TMP/src" rev-parse --short HEAD), results in $OUT"

# Rewrite the clone's [tool.mutmut] for one module (the base settings stay) and
# mark the functions left out.
configure() {
    "$PY" - "$TMP/src" "$1" "$2" "$3" <<'EOF'
import ast, json, re, sys, tomllib
src, module, tests, skip = sys.argv[1:]
path = src + "/pyproject.toml"
text = open(path).read()
conf = tomllib.loads(text)["tool"]["mutmut"]
conf.update(only_mutate=[module], pytest_add_cli_args_test_selection=tests.split())
body = "".join("%s = %s\n" % (k, json.dumps(v)) for k, v in conf.items())
start = text.index("[tool.mutmut]\n")
nxt = re.search(r"^\[", text[start + 1:], re.M)
end = start + 1 + nxt.start() if nxt else len(text)
open(path, "w").write(text[:start] + "[tool.mutmut]\n" + body + "\n" + text[end:])
if skip:
    mpath = src + "/" + module
    lines = open(mpath).read().split("\n")
    spans = [(n.lineno - len(n.decorator_list), n.end_lineno)
             for n in ast.parse("\n".join(lines)).body
             if isinstance(n, ast.FunctionDef) and n.name in skip.split()]
    if len(spans) != len(skip.split()):
        sys.exit("mutation: %s has no top-level function among %s" % (module, skip))
    for first, last in sorted(spans, reverse=True):
        lines[last:last] = ["# pragma: no mutate end"]
        lines[first - 1:first - 1] = ["# pragma: no mutate start"]
    open(mpath, "w").write("\n".join(lines))
EOF
}

rows=()
tk=0; tt=0; broken=0
for m in "${modules[@]}"; do
    case "$m" in */__init__.py) continue ;; esac
    git -C "$TMP/src" checkout -q -- .
    configure "$m" "${TESTS[$m]}" "${SKIP[$m]:-}"
    name=${m%.py}; name=${name//\//.}
    echo "mutation: $m (tests: ${TESTS[$m]})"
    (
        cd "$TMP/src"
        rm -rf mutants
        names=()
        if [ -n "$ONLY" ]; then read -r -a names <<< "$ONLY"; fi
        if [ -n "$PRIOR" ]; then
            [ -f "$PRIOR/$name.json" ] || { echo "mutation: no earlier run of $m in $PRIOR" >&2; exit 1; }
            mapfile -t names < <(sed -n 's/^### \([^ ]*\) (.*/\1/p' "$PRIOR/$name.txt")
            if [ ${#names[@]} -eq 0 ]; then
                [ "$PRIOR" -ef "$OUT" ] || cp "$PRIOR/$name.json" "$OUT/$name.json"
                : > "$OUT/$name.txt"; exit 0
            fi
        fi
        "$PY" -m mutmut run --max-children "$JOBS" "${names[@]}" > "$OUT/$name.log" 2>&1 || {
            echo "mutation: mutmut failed on $m; see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
        # one pass over mutmut's data (its `results` and `show` start a process per mutant)
        extra=()
        [ -n "$PRIOR" ] && extra=("$PRIOR/$name.json" "$PRIOR/$name.txt")
        export MUTATION_ONLY_GLOBS="$ONLY"
        "$PY" - "$OUT/$name.txt" "$OUT/$name.json" "${extra[@]}" <<'EOF'
import json, sys
from mutmut.__main__ import (SourceFileMutationData, get_diff_for_mutant, status_by_exit_code,
                             walk_mutatable_files)
# with an earlier run's counts and survivors: only those survivors were run again
prior = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
rerun = ({ln[4:].split(" ")[0] for ln in open(sys.argv[4]) if ln.startswith("### ")}
         if prior is not None else None)
import fnmatch, os
only = os.environ.get("MUTATION_ONLY_GLOBS", "").split()
counts, survivors = {}, []
for path in walk_mutatable_files():
    data = SourceFileMutationData(path=path)
    data.load()
    for mutant, code in data.exit_code_by_key.items():
        if rerun is not None and mutant not in rerun:
            continue
        if only and not any(fnmatch.fnmatchcase(mutant, g) for g in only):
            continue
        status = status_by_exit_code[code]
        counts[status] = counts.get(status, 0) + 1
        if status not in ("killed", "timeout", "segfault", "skipped"):
            diff = [ln for ln in get_diff_for_mutant(mutant, path=data.path).splitlines()
                    if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
            survivors.append("### %s (%s)\n%s\n" % (mutant, status, "\n".join(diff)))
open(sys.argv[1], "w").write("\n".join(survivors))
if prior is not None:
    # tests were only added: the earlier kills stand, the survivors run again
    # count as this run found them
    caught = ("killed", "timeout", "segfault", "skipped")
    merged = {k: v for k, v in prior.items() if k in caught}
    for k, v in counts.items():
        merged[k] = merged.get(k, 0) + v
    counts = merged
json.dump(counts, open(sys.argv[2], "w"), indent=1, sort_keys=True)
EOF
    ) || { rows+=("$(printf '%-40s mutmut failed, see %s' "$m" "$OUT/$name.log")")
           broken=1; continue; }
    read -r k t <<< "$("$PY" -c '
import json, sys
s = json.load(open(sys.argv[1]))
caught = sum(s.get(k, 0) for k in ("killed", "timeout", "segfault"))
print(caught, sum(s.values()) - s.get("skipped", 0))' "$OUT/$name.json")"
    rows+=("$(printf '%-40s %5s / %-5s %s' "$m" "$k" "$t" "$("$PY" -c "print('%.1f%%' % (100 * $k / max($t, 1)))")")")
    tk=$((tk + k)); tt=$((tt + t))
done

echo
printf '%-40s %s\n' "module" "killed / total"
printf '%s\n' "${rows[@]}"
pct=$("$PY" -c "print('%.1f' % (100 * $tk / max($tt, 1)))")
printf '%-40s %5s / %-5s %s%%\n' "all" "$tk" "$tt" "$pct"
echo "surviving mutants: $OUT/*.txt"
[ "$broken" = 0 ] || { echo "mutation: mutmut failed on some modules (above)" >&2; exit 1; }
"$PY" -c "import sys; sys.exit(0 if $tk * 100 >= $MIN * $tt else 1)" || {
    echo "mutation: $pct% killed, below MUTATION_MIN=$MIN%" >&2; exit 1; }

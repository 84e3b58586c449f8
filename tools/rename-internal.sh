#!/usr/bin/env bash
# Renames the internal functions that still carry public-looking names (hs_ followed by a
# letter) to the internal prefix hs__, as docs/HACKING.md asks: core's logging and random
# numbers, and the hearsay command's own helpers (cli, runopts, the subcommands). None of them
# is in include/hearsay/, so the export map (tools/gen-export-map) already keeps them out of
# libhearsay.so; this only makes the names say so. Meant to run once, from the repository root,
# after the parallel branches are merged (renaming on one branch would conflict with all the
# others); then rebuild and run the tests.
#   tools/rename-internal.sh           rename in src/, tests/ and tools/ (C and CUDA sources)
#   tools/rename-internal.sh --check   list the hs_ functions defined under src/ and declared in
#                                      no public header (exit 1 if any): what is left to rename,
#                                      including any a merged branch added
set -euo pipefail
cd "$(dirname "$0")/.."
names=(
    hs_cli_double hs_cli_expand_config hs_cli_float hs_cli_help hs_cli_install_signals
    hs_cli_int hs_cli_interrupted hs_cli_long hs_cli_now hs_cli_parse hs_cli_signal hs_cli_u64
    hs_cli_upper hs_cli_usage_error hs_cli_cmd hs_cli_check_out_path hs_cli_precheck
    hs_launch_write_config
    hs_cmd_launch hs_cmd_run hs_cmd_sim hs_cmd_topo hs_cmd_train
    hs_log hs_log_quiet hs_log_set_tag
    hs_rng_double hs_rng_gamma hs_rng_init hs_rng_normal hs_rng_shuffle_u32 hs_rng_u32
    hs_rng_u64 hs_rng_uniform
    hs_runopts_check_hidden hs_runopts_choco_step hs_runopts_default hs_runopts_finish
    hs_runopts_guard_cfg hs_runopts_handle hs_runopts_load_data hs_runopts_open
    hs_runopts_print_data hs_runopts_rounds hs_runopts_slowdown hs_runopts_trainer_cfg
)

# The CUDA module's entry point keeps its name: the library finds it with dlsym by that name
# (src/cuda/backend_cuda.cu), an interface between two binaries like the public API.
keep='^hs_cuda_backend_open$'

defined_internal() {
    # Non-static functions defined under src/, minus the public ones and those kept.
    grep -rhoE '^[A-Za-z_][^;(]*[^A-Za-z0-9_](hs_[a-z0-9][A-Za-z0-9_]*)\(' src \
        --include='*.c' --include='*.cu' | grep -v '^static' |
        grep -oE 'hs_[a-z0-9][A-Za-z0-9_]*\($' | tr -d '(' | sort -u |
        comm -23 - <(tools/gen-export-map --list) | grep -vE "$keep" || true
}

if [[ ${1:-} == --check ]]; then
    left=$(defined_internal)
    [[ -z $left ]] && { echo "no internal function carries a public name"; exit 0; }
    echo "internal functions with public names:" $left
    exit 1
fi
files=$(git ls-files 'src/*.c' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'tests/*.c' 'tests/*.h' \
    'tools/*.c' 'tools/*.h')
alt=$(printf '%s|' "${names[@]#hs_}")
# \b on both sides: hs_log renames calls of hs_log, never hs_log_set_callback (public).
# shellcheck disable=SC2086
sed -i -E "s/\\bhs_(${alt%|})\\b/hs__\\1/g" $files
echo "renamed ${#names[@]} names in $(wc -w <<<"$files") files; left: $(defined_internal | wc -l)"

#!/usr/bin/env python3
"""readme-commands.py MRCACHE: checks every shell block of README.md.

Every ```sh block must follow a marker line (blank lines between allowed):

  <!-- readme-check: run -->     each line runs from the repository root, as
                                 written, with MRCACHE's directory first on
                                 PATH; it must exit 0 within 300 s. For the
                                 commands that take seconds.
  <!-- readme-check: syntax -->  the block must parse (bash -n); each line's
                                 program must exist: `mrcache SUB ARGS` runs
                                 as `mrcache SUB ARGS --help` (`--help` before
                                 any `--`), so clap checks the subcommand, the
                                 options and their values without running it;
                                 `bash FILE` needs FILE to exist and parse;
                                 `cargo run -p PKG --example EX` needs PKG to
                                 have the example. For long runs.
  <!-- ci/c-tests.sh runs the next block verbatim -->
                                 ci/c-tests.sh runs it on a fresh prefix.

A block without a marker fails, so no command goes unchecked. ci/test.sh
runs this with the binary `cargo test` built (ci/test-binary.sh src/main.rs).
"""
import json, os, re, shlex, subprocess, sys

MARKER = re.compile(r'<!--\s*(?:readme-check:\s*(run|syntax)|(ci/c-tests\.sh) runs the next block verbatim)\s*-->')


def blocks(text):
    """(line number, mode, [lines]) of every ```sh block; mode None if unmarked."""
    lines = text.splitlines()
    i, mode, out = 0, None, []
    while i < len(lines):
        l = lines[i]
        m = MARKER.search(l)
        if m:
            mode = m.group(1) or 'c-tests'
        elif l.startswith('```'):
            lang = l[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith('```'):
                j += 1
            if lang in ('sh', 'bash', 'shell', 'console'):
                out.append((i + 1, mode, lines[i + 1:j]))
            mode = None
            i = j
        elif l.strip():
            mode = None
        i += 1
    return out


def commands(block):
    """The block's commands without their trailing comments."""
    for l in block:
        try:
            toks = shlex.split(l, comments=True)
        except ValueError as e:
            yield l, None, str(e)
            continue
        if toks:
            yield l, toks, None


def cargo_targets():
    meta = json.loads(subprocess.run(['cargo', 'metadata', '-q', '--no-deps', '--format-version', '1'],
                                     check=True, capture_output=True, text=True).stdout)
    return {p['name']: {(k, t['name']) for t in p['targets'] for k in t['kind']} for p in meta['packages']}


def check_syntax(toks, mrcache, env, targets):
    prog = toks[0]
    if prog == 'mrcache':
        args = toks[1:]
        cut = args.index('--') if '--' in args else len(args)
        r = subprocess.run([mrcache] + args[:cut] + ['--help'], capture_output=True, text=True, env=env, timeout=60)
        return None if r.returncode == 0 else f'`mrcache ... --help` exit {r.returncode}: {r.stderr.strip()[:300]}'
    if prog == 'bash':
        path = toks[1]
        if not os.path.isfile(path):
            return f'no file {path}'
        r = subprocess.run(['bash', '-n', path], capture_output=True, text=True)
        return None if r.returncode == 0 else f'bash -n {path}: {r.stderr.strip()}'
    if prog == 'cargo' and 'run' in toks and '--example' in toks:
        pkg = toks[toks.index('-p') + 1] if '-p' in toks else None
        ex = toks[toks.index('--example') + 1]
        if pkg not in targets or ('example', ex) not in targets[pkg]:
            return f'package {pkg} has no example {ex}'
    return None


def main():
    mrcache = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else 'target/debug/mrcache')
    if not os.access(mrcache, os.X_OK):
        sys.exit(f'readme-commands: no mrcache binary at {mrcache} (build it, or pass its path)')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)
    env = dict(os.environ, PATH=os.path.dirname(mrcache) + os.pathsep + os.environ['PATH'])
    targets = None
    failures, counts = [], {'run': 0, 'syntax': 0, 'c-tests': 0}
    for line, mode, block in blocks(open('README.md').read()):
        where = f'README.md:{line}'
        if mode is None:
            failures.append(f'{where}: a shell block without a readme-check marker')
            continue
        if mode == 'c-tests':
            counts[mode] += 1
            continue
        r = subprocess.run(['bash', '-n'], input='\n'.join(block) + '\n', capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f'{where}: does not parse: {r.stderr.strip()}')
            continue
        for text, toks, err in commands(block):
            counts[mode] += 1
            if err:
                failures.append(f'{where}: {text}: {err}')
                continue
            if mode == 'run':
                try:
                    r = subprocess.run(['bash', '-euo', 'pipefail', '-c', text], capture_output=True, text=True,
                                       env=env, timeout=300)
                    problem = None if r.returncode == 0 else f'exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}'
                except subprocess.TimeoutExpired:
                    problem = 'did not finish in 300 s'
            else:
                if toks[0] == 'cargo' and targets is None:
                    targets = cargo_targets()
                problem = check_syntax(toks, mrcache, env, targets)
            if problem:
                failures.append(f'{where}: {text.strip()}\n    {problem}')
    print(f"readme-commands: {counts['run']} commands run, {counts['syntax']} checked for syntax and options, "
          f"{counts['c-tests']} block(s) left to ci/c-tests.sh")
    if failures:
        print('\n'.join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()

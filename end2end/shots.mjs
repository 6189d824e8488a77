import { chromium } from "@playwright/test";
const base = process.argv[2];
const pages = process.argv.slice(3);
const b = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] });
const ctx = await b.newContext({ viewport: { width: 1280, height: 900 } });
for (const path of pages) {
  const p = await ctx.newPage();
  const errs = [];
  p.on("console", m => { if (m.type() === "error") errs.push(m.text()); });
  p.on("pageerror", e => errs.push(e.message));
  await p.goto(base + path);
  try { await p.waitForSelector("main[data-hydrated=true]", { timeout: 15000 }); } catch (e) { errs.push("NOT HYDRATED"); }
  await p.waitForTimeout(500);
  const name = path.replace(/[^a-z0-9]+/gi, "_") || "root";
  await p.screenshot({ path: `/tmp/shots/${name}.png`, fullPage: true });
  console.log(path, "errors:", JSON.stringify(errs));
  await p.close();
}
await b.close();

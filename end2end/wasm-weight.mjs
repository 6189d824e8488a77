// WASM weight per console page, as a browser loads it.
//
// Opens every page in a fresh Chromium context (empty cache) against a running console,
// waits until the page has hydrated, and sums the .wasm bytes it fetched: the entry module,
// the page's own module and the shared chunks that page needs. Prints one line per page
// (decoded bytes and bytes on the wire) and the largest page last.
//
//   node end2end/wasm-weight.mjs [BASE_URL]      (default http://127.0.0.1:3000)
//
// Run it against a release build (`scripts/run.sh`): debug WASM is several times larger.
import { chromium } from "@playwright/test";

const base = (process.argv[2] ?? "http://127.0.0.1:3000").replace(/\/$/, "");
const executablePath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";

async function firstLink(page, prefix) {
  const hrefs = await page.$$eval("a[href]", (links) => links.map((a) => a.getAttribute("href")));
  return hrefs.find((h) => h.startsWith(prefix) && h !== prefix && !h.endsWith("/new"));
}

const browser = await chromium.launch({ executablePath, args: ["--no-sandbox", "--disable-gpu"] });
try {
  // Detail pages take their ids from the list pages, so this works on any fleet.
  const probe = await browser.newPage();
  await probe.goto(`${base}/hosts`);
  const host = await firstLink(probe, "/hosts/");
  await probe.goto(`${base}/services`);
  const service = await firstLink(probe, "/services/");
  await probe.goto(`${base}/task-definitions`);
  const family = await firstLink(probe, "/task-definitions/");
  await probe.close();

  const pages = ["/", "/hosts", host, "/services", "/services/new", service,
    "/task-definitions", "/task-definitions/new", family].filter(Boolean);
  let largest = { path: "", decoded: 0 };
  console.log("page".padEnd(40), "wasm bytes".padStart(10), "on the wire".padStart(12), "files".padStart(6));
  for (const path of pages) {
    const context = await browser.newContext();
    const page = await context.newPage();
    const fetched = [];
    page.on("response", (response) => {
      if (new URL(response.url()).pathname.endsWith(".wasm")) fetched.push(response);
    });
    await page.goto(`${base}${path}`);
    await page.waitForSelector("main[data-hydrated=true]", { timeout: 30_000 });
    let decoded = 0;
    let wire = 0;
    for (const response of fetched) {
      decoded += (await response.body()).length;
      const sizes = await response.request().sizes();
      wire += sizes.responseBodySize;
    }
    console.log(path.padEnd(40), String(decoded).padStart(10), String(wire).padStart(12), String(fetched.length).padStart(6));
    if (decoded > largest.decoded) largest = { path, decoded };
    await context.close();
  }
  console.log(`largest: ${largest.path} ${largest.decoded} bytes of WASM`);
} finally {
  await browser.close();
}

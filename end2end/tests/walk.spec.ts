import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// The console walked as a person reads it: page after page through its own links, with a
// pause before each that is longer than every timeout of the server (playwright.config
// starts it with a 2 s header timeout and an 8 s request timeout). Idle and preconnected
// connections are closed meanwhile; nothing the browser loads may fail for it, and no
// page may log an error or stop.
const PAUSE_MS = 9_000;

test("every page, after pauses longer than the server's timeouts, loads without an error", async ({ page }) => {
  test.setTimeout(15 * 60_000);
  const errors = watchConsole(page);
  const failed: string[] = [];
  page.on("response", (r) => {
    if (r.status() >= 400 && r.status() !== 401) failed.push(`${r.status()} ${r.url()}`);
  });
  page.on("requestfailed", (r) => {
    // A request the browser cancelled itself (a navigation leaving a page whose files or
    // live event stream were still loading) is not the server's failure.
    const why = r.failure()?.errorText ?? "";
    if (why !== "net::ERR_ABORTED") failed.push(`${why} ${r.url()}`);
  });
  await open(page, "/");
  const pages = [
    "/hosts",
    "/services",
    "/services/new",
    "/task-definitions",
    "/task-definitions/new",
    "/projects",
    "/consolidation",
    "/users",
    "/notifications",
    "/audit",
    "/",
  ];
  for (const path of pages) {
    await page.waitForTimeout(PAUSE_MS);
    // Through the page's own link where it has one (a client-side navigation, which loads
    // the page's code over connections left idle), else by address.
    const link = page.locator(`header a[href="${path}"]`).first();
    if (await link.count()) {
      await link.click();
      await expect(page).toHaveURL(new RegExp(`${path.replace(/\//g, "\\/")}$`));
    } else {
      await page.goto(path);
    }
    await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
    await expect(page.locator("main")).not.toContainText("Loading…", { timeout: 20_000 });
  }
  // One host's and one service's own page.
  for (const list of ["/hosts", "/services"]) {
    await page.waitForTimeout(PAUSE_MS);
    await page.goto(list);
    await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
    const first = page.locator(`main a[href^="${list}/"]:not([href$="/new"])`).first();
    await page.waitForTimeout(PAUSE_MS);
    await first.click();
    await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
    await expect(page.locator(".crumbs")).toBeVisible();
  }
  // And one task's, from that service's page.
  await page.waitForTimeout(PAUSE_MS);
  await page.locator('main a[href^="/tasks/"]').first().click();
  await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
  await expect(page.locator(".crumbs")).toContainText("task ");
  expect(failed, failed.join("\n")).toEqual([]);
  expect(errors, errors.join("\n")).toEqual([]);
});

// When a page's code cannot be fetched at all (the network, a proxy), the page says so and
// offers a reload instead of going dead without a word.
test("a page whose code cannot load says so and offers a reload", async ({ page }) => {
  await open(page, "/");
  await page.route(/\/pkg\/split___audit_route_view_.*\.wasm$/, (route) => route.abort());
  await page.locator('header a[href="/audit"]').click();
  const notice = page.locator("#console-broken");
  await expect(notice).toBeVisible({ timeout: 20_000 });
  await expect(notice).toContainText("Reload the page");
  await page.unroute(/\/pkg\/split___audit_route_view_.*\.wasm$/);
  await Promise.all([
    page.waitForEvent("load"),
    notice.getByRole("link", { name: "Reload the page" }).click(),
  ]);
  await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
  await expect(page.locator("#console-broken")).toHaveCount(0);
  // Alive again: the page that could not load now does.
  await page.locator('header a[href="/audit"]').click();
  await expect(page.locator("main h1")).toContainText("Audit");
});

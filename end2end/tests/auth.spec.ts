import { test, expect } from "@playwright/test";
import { ADMIN_PASSWORD, open, sameOrigin, signIn, watchConsole } from "./browser";

// Signing in, roles in the page, the audit log: they share one demo server, in order.
test.describe.configure({ mode: "serial" });

test("a page asks to sign in, refuses a wrong password, then shows who is signed in", async ({ page }) => {
  const errors = watchConsole(page);
  await page.goto("/services");
  await expect(page).toHaveURL(/\/sign-in\?next=%2Fservices$/);
  await expect(page.getByRole("heading", { name: "Sign in to Tessera" })).toBeVisible();
  await expect(page.locator("nav[aria-label=Main]")).toHaveCount(0);
  await page.screenshot({ path: "screenshots/sign-in.png", fullPage: true });
  await page.getByLabel("Username").fill("admin");
  await page.getByLabel("Password").fill("not-the-password");
  await page.getByRole("button", { name: "Sign in" }).click();
  await expect(page.getByRole("alert")).toHaveText(/Wrong username or password/);
  await signIn(page, "admin", ADMIN_PASSWORD);
  await expect(page).toHaveURL(/\/services$/);
  await expect(page.locator(".whoami .badge")).toHaveText("admin");
  await expect(page.getByRole("link", { name: "Audit log" })).toBeVisible();
  await page.screenshot({ path: "screenshots/signed-in.png", fullPage: true });
  expect(errors).toEqual([]);
  await page.getByRole("button", { name: "Sign out" }).click();
  await expect(page).toHaveURL(/\/sign-in$/);
  // A request the signed-in page had in flight as the session ended may be refused while
  // that page unloads; the pages after it must be clean.
  errors.length = 0;
  await page.goto("/hosts");
  await expect(page).toHaveURL(/\/sign-in\?next=%2Fhosts$/);
  expect(errors).toEqual([]);
});

test("a viewer sees what it cannot change disabled, with the reason", async ({ page, browser }) => {
  await open(page, "/");
  const made = await page.request.post("/api/v1/users", {
    data: { username: "vera", password: "vera-viewer-password", role: "viewer" },
    headers: sameOrigin,
  });
  expect(made.status()).toBe(201);
  // Without the console's origin the same request is refused.
  const crossSite = await page.request.post("/api/v1/users", {
    data: { username: "mallory", password: "mallory-password-1", role: "admin" },
    headers: { Origin: "http://evil.example" },
  });
  expect(crossSite.status()).toBe(403);

  const context = await browser.newContext();
  const viewer = await context.newPage();
  const errors = watchConsole(viewer);
  await open(viewer, "/hosts/sim-l4-1", "vera", "vera-viewer-password");
  await expect(viewer.locator(".whoami .badge")).toHaveText("viewer");
  const drain = viewer.getByRole("button", { name: "Drain" });
  await expect(drain).toBeDisabled();
  await expect(drain).toHaveAttribute("title", "needs the operator role; you are viewer");
  await viewer.screenshot({ path: "screenshots/viewer-host.png", fullPage: true });
  await open(viewer, "/task-definitions/new", "vera", "vera-viewer-password");
  await expect(viewer.getByRole("button", { name: "Register" })).toBeDisabled();
  await expect(viewer.getByRole("link", { name: "Audit log" })).toHaveCount(0);
  expect(errors).toEqual([]);
  await context.close();
});

test("the audit log shows who changed what, with filters", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/audit");
  const rows = page.locator("table.audit tbody tr");
  await expect(rows.filter({ hasText: "POST /api/v1/users" })).toHaveCount(1);
  await expect(rows.filter({ hasText: "POST /api/v1/users" })).toContainText("user admin");
  await expect(rows.filter({ hasText: "POST /api/v1/users" })).toContainText("vera");
  await page.getByLabel("Who").fill("vera");
  await page.getByRole("button", { name: "Filter" }).click();
  await expect(page).toHaveURL(/\/audit\?actor=vera$/);
  await expect(rows.filter({ hasText: "sign in" })).toHaveCount(1);
  await page.screenshot({ path: "screenshots/audit.png", fullPage: true });
  expect(errors).toEqual([]);
});

test("a secret set through the form is never shown again, and a new revision keeps it", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/task-definitions/new");
  await page.getByLabel("Family").fill("e2e-secret");
  await page.getByLabel("Command (arguments separated by spaces)").fill("sleep 600");
  await page.getByLabel("GPU memory (MiB)").fill("1024");
  await page.getByLabel(/^Secrets/).fill("API_KEY=e2e-hidden-value");
  await page.getByRole("button", { name: "Register" }).click();
  await expect(page).toHaveURL(/\/task-definitions\/e2e-secret$/);
  await expect(page.locator("pre.diff")).toContainText('"API_KEY": {');
  expect(await page.content()).not.toContain("e2e-hidden-value");
  await page.screenshot({ path: "screenshots/task-definition-secret.png", fullPage: true });

  await open(page, "/task-definitions/new?from=e2e-secret:1");
  await expect(page.getByLabel(/^Secrets/)).toHaveValue("API_KEY");
  await page.getByRole("button", { name: "Register" }).click();
  await expect(page.getByRole("cell", { name: "e2e-secret:2" })).toBeVisible();
  const described = await (await page.request.get("/api/v1/task-definitions/e2e-secret:2")).json();
  expect(described.spec.containers[0].secrets).toEqual({ API_KEY: { set: true } });
  expect(errors).toEqual([]);
});

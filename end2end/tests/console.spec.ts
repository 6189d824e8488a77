import { test, expect } from "@playwright/test";
import { open, sameOrigin, watchConsole } from "./browser";

// The operator's paths through the console, in order: they share one demo server.
test.describe.configure({ mode: "serial" });

test("bad input in the task definition form shows the validator's messages and registers nothing", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/task-definitions/new");
  await page.getByLabel("Family").fill("bad family!");
  await page.getByLabel("Command (arguments separated by spaces)").fill("sleep 600");
  await page.getByLabel("GPU memory (MiB)").fill("0");
  await page.getByRole("button", { name: "Register" }).click();
  await expect(page.getByText("use 1 to 255 letters, digits, '-' or '_'")).toBeVisible();
  await expect(page.getByText(/must be between 1 and \d+, got 0/)).toBeVisible();
  await expect(page).toHaveURL(/\/task-definitions\/new$/);
  await page.screenshot({ path: "screenshots/task-definition-invalid.png", fullPage: true });
  const defs = await (await page.request.get("/api/v1/task-definitions")).json();
  expect(defs.task_definitions.map((d: { family: string }) => d.family)).not.toContain("bad family!");
  expect(errors).toEqual([]);
});

test("a task definition registered through the form", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/task-definitions/new");
  await page.getByLabel("Family").fill("e2e-infer");
  await page.getByLabel("Command (arguments separated by spaces)").fill("sleep 600");
  await page.getByLabel("GPU memory (MiB)").fill("4096");
  await page.getByLabel("Compute cap (%, optional)").fill("20");
  await page.getByLabel("Environment (KEY=VALUE per line)").fill("MODEL=tiny");
  await page.getByRole("button", { name: "Register" }).click();
  await expect(page).toHaveURL(/\/task-definitions\/e2e-infer$/);
  await expect(page.getByRole("cell", { name: "e2e-infer:1" })).toBeVisible();
  await expect(page.getByRole("cell", { name: "MPS: 4 GiB, 20% compute" })).toBeVisible();
  await page.screenshot({ path: "screenshots/task-definition-registered.png", fullPage: true });
  expect(errors).toEqual([]);
});

test("a service created through the wizard, seeing the preview first", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/services/new");
  // The browser checks each step with the server's rules before the next one opens.
  await page.getByLabel("Service name").fill("E2E svc");
  await page.getByRole("button", { name: "Next" }).click();
  await expect(page.getByRole("alert")).toContainText("name");
  await expect(page.getByLabel("Service name")).toBeVisible();
  await page.getByLabel("Service name").fill("e2e-svc");
  await expect(page.getByRole("alert")).toHaveCount(0);
  await page.getByLabel("Task definition").selectOption("e2e-infer:1");
  await page.getByRole("button", { name: "Next" }).click();
  await page.locator("select[name=pool]").selectOption("inference");
  await page.getByLabel("Desired tasks").fill("three");
  await page.getByRole("button", { name: "Next" }).click();
  await expect(page.getByRole("alert")).toContainText("desired_count: must be a whole number");
  await page.getByLabel("Desired tasks").fill("3");
  await expect(page.getByRole("alert")).toHaveCount(0);
  await page.getByRole("button", { name: "Next" }).click();
  await page.getByRole("button", { name: "Next" }).click();
  await page.getByRole("button", { name: "Preview" }).click();
  await expect(page.getByText("3 of 3 task(s) would be placed now")).toBeVisible();
  const rows = page.locator("table.preview tbody tr");
  await expect(rows).toHaveCount(3);
  await expect(rows.first().locator("td").nth(1)).toHaveText(/^sim-l4-\d$/);
  await page.screenshot({ path: "screenshots/service-wizard-preview.png", fullPage: true });
  await page.getByRole("button", { name: "Create" }).click();
  await expect(page).toHaveURL(/\/services\/e2e-svc$/);
  await expect(page.locator("tr.task.state-running")).toHaveCount(3);
  await page.screenshot({ path: "screenshots/service-detail.png", fullPage: true });
  expect(errors).toEqual([]);
});

test("tasks appear on the hosts page without a reload", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/hosts?pool=inference");
  const segments = page.locator('.segment[data-service="e2e-svc"]');
  await expect(segments).toHaveCount(3);
  const scaled = await page.request.patch("/api/v1/services/e2e-svc", { data: { desired_count: 5 }, headers: sameOrigin });
  expect(scaled.ok()).toBeTruthy();
  // No navigation: the server's event stream refreshes the page.
  await expect(segments).toHaveCount(5);
  await page.screenshot({ path: "screenshots/hosts-live.png", fullPage: true });

  // The keyboard reaches every task's segment, and focus shows its details.
  let focused = "";
  for (let i = 0; i < 60 && !focused.includes("e2e-svc"); i++) {
    await page.keyboard.press("Tab");
    focused = await page.evaluate(() => {
      const el = document.activeElement;
      return el?.classList.contains("segment") ? el.getAttribute("data-service") ?? "" : "";
    });
  }
  expect(focused).toBe("e2e-svc");
  const tip = page.locator(".segment:focus .tip");
  await expect(tip).toBeVisible();
  await expect(tip).toContainText("service e2e-svc");
  await expect(tip).toContainText("compute cap");
  await expect(tip).toContainText("measured peak");
  await page.screenshot({ path: "screenshots/hosts-keyboard.png", fullPage: true });
  expect(errors).toEqual([]);
});

test("draining a host moves its tasks elsewhere", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/hosts");
  const tasks = (await (await page.request.get("/api/v1/tasks?service=e2e-svc&state=running")).json()).tasks;
  const host: string = tasks[0].host;
  const other = host === "sim-l4-1" ? "sim-l4-2" : "sim-l4-1";
  await open(page, `/hosts/${host}`);
  await page.getByRole("button", { name: "Drain" }).click();
  await expect(page.locator(".host-card .badge.status-draining")).toBeVisible();
  // Replacements start on the other host, then the old tasks stop.
  await expect(page.locator(".segment")).toHaveCount(0);
  const after = (await (await page.request.get("/api/v1/tasks?service=e2e-svc&state=running")).json()).tasks;
  expect(after).toHaveLength(5);
  for (const t of after) expect(t.host).toBe(other);
  await page.screenshot({ path: "screenshots/host-drained.png", fullPage: true });
  await page.getByRole("button", { name: "Activate" }).click();
  await expect(page.locator(".host-card .badge.status-active")).toBeVisible();
  expect(errors).toEqual([]);
});

test("the overview shows density, pending work and events", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/");
  await expect(page.getByRole("heading", { name: "Packing density" })).toBeVisible();
  await expect(page.getByText(/tasks per GPU in use/)).toBeVisible();
  await expect(page.locator(".events li").first()).toBeVisible();
  await page.screenshot({ path: "screenshots/overview.png", fullPage: true });
  expect(errors).toEqual([]);
});

test("the projects page shows each project's quota and use per pool", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/projects");
  await expect(page.getByRole("heading", { name: "Projects", exact: true })).toBeVisible();
  // The demo's services are all in the default project: it uses GPU memory in its pools.
  const row = page.locator("table.projects tbody tr", { has: page.getByRole("rowheader", { name: "default" }) }).first();
  await expect(row).toBeVisible();
  await expect(row).toContainText("no limit");
  await expect(row).toContainText("GPU memory");
  await expect(page.getByRole("heading", { name: "Use over time" })).toBeVisible();
  await expect(page.getByRole("heading", { name: "Recent preemptions" })).toBeVisible();
  await page.screenshot({ path: "screenshots/projects.png", fullPage: true });
  // A project's name leads to its services, filtered.
  await row.getByRole("link", { name: "default" }).click();
  await expect(page).toHaveURL(/\/services\?project=default$/);
  await expect(page.locator("select[name=project]")).toHaveValue("default");
  // Every service of the demo (and of the other tests) is in default: none is hidden.
  await expect(page.locator("form.filters .count")).toHaveText(/^\d+ services$/);
  await expect(page.locator("tr[data-service] td:nth-child(2)").first()).toHaveText("default");
  await page.screenshot({ path: "screenshots/services-by-project.png" });
  expect(errors).toEqual([]);
});

import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// Projects administered in the browser: a project added (a bad weight named by the
// server), a quota set in a pool (a value that is not a number named before it is sent),
// and a user given a role in it, each as the API then reads it.
test("an admin adds a project, sets its quota in a pool and gives a user a role in it", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/projects");
  const panel = page.getByRole("region", { name: "Administer projects" });
  const add = panel.getByRole("form", { name: "New project" });
  await add.getByLabel("Name").fill("research");
  await add.getByLabel("Weight").fill("0");
  await add.getByRole("button", { name: "Add project" }).click();
  await expect(add.locator(".field-error")).toContainText("must be between 1 and");
  await add.getByLabel("Weight").fill("2");
  await add.getByRole("button", { name: "Add project" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Project added." })).toBeVisible();

  const quota = panel.getByRole("form", { name: "Quota" });
  await quota.locator("select[name=quota-project]").selectOption("research");
  await quota.locator("select[name=quota-pool]").selectOption("inference");
  await quota.getByLabel("Guaranteed GPUs").fill("one");
  await quota.getByRole("button", { name: "Set quota" }).click();
  await expect(quota.locator(".field-error")).toContainText("must be a whole number");
  await quota.getByLabel("Guaranteed GPUs").fill("1");
  await quota.getByLabel("Limit GPUs").fill("2");
  await quota.getByRole("button", { name: "Set quota" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Quota set." })).toBeVisible();
  const research = (await (await page.request.get("/api/v1/projects/research")).json());
  expect(research.weight).toBe(2);
  expect(research.quotas).toEqual([{ pool: "inference", guaranteed: { gpus: 1 }, limit: { gpus: 2 } }]);
  await expect(page.locator("table.projects tr", { hasText: "research" })).toContainText("inference");

  const member = panel.getByRole("form", { name: "Member" });
  await member.locator("select[name=member-project]").selectOption("research");
  await member.getByLabel("User").fill("nobody-here");
  await member.getByRole("button", { name: "Set role" }).click();
  await expect(panel.locator(".field-error, [role=alert]").first()).toContainText("nobody-here");
  await member.getByLabel("User").fill("vera");
  await member.locator("select[name=member-role]").selectOption("operator");
  await member.getByRole("button", { name: "Set role" }).click();
  await expect(page.getByRole("status").filter({ hasText: "Role set." })).toBeVisible();
  const after = (await (await page.request.get("/api/v1/projects/research")).json());
  expect(after.members).toEqual([{ username: "vera", role: "operator" }]);
  await page.screenshot({ path: "screenshots/projects-admin.png", fullPage: true });
  expect(errors).toEqual([]);
});
